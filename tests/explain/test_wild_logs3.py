"""Misreadings found by the third sweep of logs posted in issue threads (tests/fixtures/corpus/explain/wild3/), each
fixed in general form: the class of log, not the one thread."""

from __future__ import annotations

from conftest import ROOT

from loraflow.explain import diagnose_log
from loraflow.explain.facts import read_facts
from loraflow.explain.logread import view

WILD3 = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild3"


def _found(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


def test_notebook_frames_are_frames_so_a_cut_notebook_traceback_is_truncated():
    # Baichuan-13B in Jupyter: torch's reentrant warning, then IPython's `RuntimeError   Traceback` header and
    # `File /x.py:1537, in Trainer.train(...)` frames, cut before the message. Read as a crash cut short, not as a
    # warning with no crash after it (which would name the silent variant).
    log = view((WILD3 / "21-baichuan13b14-notebook-reentrant-warning-cut.log").read_text())
    assert [f.function for f in log.frames] == ["Trainer.train"] and log.shape == "truncated"
    assert _found(log.text)[0] == ("reentrant-frozen-inputs", "likely")
    # VS Code's notebook output prints the same frame form, its source lines wrapped in links.
    log = view((WILD3 / "15-autogptq667-vscode-links-target-modules-empty.log").read_text())
    assert [f.function for f in log.frames] == ["PeftModel.__init__"]
    # Python's and rich's forms are read as before.
    assert len(view('  File "/a/t.py", line 9, in f\n│ /a/t.py:9 in g\n').frames) == 2


def test_collectives_that_merely_hung_together_are_not_ranks_running_different_modules():
    # NCCL all-to-all and all-reduce timeouts in two process groups (nccl#1610): a hang, not the skipped-vision-tower
    # mismatch, which shows collectives of one kind and different sizes on two ranks.
    text = (WILD3 / "29-nccl1610-alltoall-timeout-timestamped.log").read_text()
    assert "rank_sizes_differ" not in read_facts(view(text)) and _found(text) == []
    same = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=_ALLGATHER_BASE, "
            "NumelIn=1179648, NumelOut=4718592, Timeout(ms)=1800000) ran for 1800077 milliseconds before timing out.\n"
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=_ALLGATHER_BASE, "
            "NumelIn=2097152, NumelOut=8388608, Timeout(ms)=1800000) ran for 1800079 milliseconds before timing out.")
    assert "rank_sizes_differ" in read_facts(view(same))
