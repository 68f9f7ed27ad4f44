"""Misreadings found by sweeping logs people posted in issue threads (tests/fixtures/corpus/explain/wild/), each fixed
in general form: the class of log, not the one thread."""

from __future__ import annotations

from conftest import ROOT

from loraflow.explain import diagnose_log

WILD = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild"


def _ids(text: str) -> list[str]:
    _, candidates, _ = diagnose_log(text)
    return [c.rule.id for c in candidates]


def test_a_raise_frame_the_traceback_went_past_is_not_where_the_log_stopped():
    # MemoRAG: cut in modeling_utils.from_pretrained -> dispatch_model, below auto_factory's from_pretrained. The
    # auto class resolved the model class (its refusal of an image-text config is raised in its own frame).
    text = (WILD / "12-memorag58-from-pretrained-dispatch-to-8bit.log").read_text()
    assert _ids(text) == []
    # Cut on auto_factory's frame itself, the same causal-LM load is still read as that refusal's raise path.
    cut = text[:text.index("  File \"/root/.cache")]
    assert "vlm-wrong-auto-class" in _ids(cut)


def test_a_quantized_model_refused_a_move_while_loading_is_neither_a_merge_nor_a_later_move():
    text = (WILD / "10-glm4voice152-windows-dispatch-model-to-4bit.log").read_text()
    assert _ids(text) == []
    # The bare refusal, with nothing to say where it was raised, keeps its known causes.
    assert set(_ids(text.splitlines()[-1])) >= {"kbit-merge", "kbit-model-moved"}
