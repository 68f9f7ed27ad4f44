"""The fourth sweep of logs posted in issue threads (tests/fixtures/corpus/explain/wild4/): RL frameworks with vLLM
rollouts (verl, NeMo-RL, ROLL, ms-swift GRPO), FSDP, DeepSpeed ZeRO-2 and their decoys. No misreading was found in
it; these pin the forms it exercised, so that a later change to the reader keeps them."""

from __future__ import annotations

import json

from conftest import ROOT

from loraflow.explain import diagnose_log

WILD4 = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild4"


def _found(name: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log((WILD4 / name).read_text())
    return [(c.rule.id, c.confidence) for c in candidates]


def test_engine_core_rewrapped_worker_error_is_read():
    # vLLM v1 re-raises a worker's error inside `Worker failed with error '...'` under the EngineCore prefix.
    assert _found("01-lf9512-enginecore-worker-failed-max-lora-rank.log")[0] == ("vllm-max-lora-rank", "confirmed")


def test_launcher_and_quote_prefixes_keep_the_own_message():
    # torchrun's `[default0]:`, a markdown `>` and a terminal-wrapped frame path around the error line.
    assert _found("05-piccolo8-default0-prefix-already-reduced.log")[0][0] == "zero-grad-reduced-twice"
    assert _found("04-audiocraft260-fsdp-frozen-output-proj-quoted.log")[0][0] == "fsdp1-mixed-requires-grad"
    assert _found("02-roll418-vllm-base-model-wrapped-paths.log")[0][0] == "vllm-sync-peft-names"


def test_vllm_loader_refusing_other_names_is_not_the_peft_sync():
    # `no module or parameter named 'language_model'` is a checkpoint the architecture does not fit, not a policy
    # synced under PEFT's `base_model.` names.
    assert _found("14-unsloth2274-vllm-4bit-gemma3-language-model.log") == []


def test_ray_and_launcher_deaths_claim_nothing():
    for name in ("10-verl2380-ray-objects-valid-check-failed.log", "11-rllm8-fsdp-workers-actor-died-raylet.log",
                 "12-searchr1-134-h20-actor-died-system-error.log", "17-msswift3666-grpo-vlm-eval-launcher-only.log",
                 "23-nemogym356-actor-died-policy-init-wide.log"):
        assert _found(name) == [], name


def test_excerpts_cut_before_their_failure_get_no_wrong_claim():
    # A paste that stops in accelerate's prepare (FSDP + QLoRA) must not be read as a quantized model moved by
    # prepare; one that stops in ZeRO-2's reduce hook names nothing.
    manifest = json.loads((WILD4 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta.get("evidence_in_log") is False:
            found = _found(name)
            assert not found or found[0][0] == meta["expected"], name
