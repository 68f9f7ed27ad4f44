"""benchmarks/paste_robustness.py on three paste forms: every corpus failure explain names right as stored keeps its
rule behind a rank prefix, a markdown quote, a shell prompt, HTML entities or a
torchrun failure summary after it, and no unclaimed decoy becomes claimed."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from paste_robustness import measure  # noqa: E402


def test_pasted_forms_keep_every_answer():
    out = measure(("rank prefix", "quoted", "shell prompt", "html escaped", "torchrun tail"))
    for name, r in out.items():
        assert r["of"] > 80 and r["decoys"] > 80, (name, r["of"], r["decoys"])
        assert r["kept"] == r["of"] and not r["decoys_claimed"], (name, r["lost"], r["decoys_claimed"])


def test_a_launch_pasted_in_a_fence_or_behind_a_prompt_gives_the_same_findings():
    from paste_robustness import measure_check

    out = measure_check(("fenced", "shell prompt"))
    for name, r in out.items():
        assert r["of"] > 50 and r["same"] == r["of"], (name, r["changed"])
