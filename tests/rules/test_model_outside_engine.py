"""zero3-model-outside-engine: a second model (a DPO reference, a teacher, a frozen text encoder) built under ZeRO-3's
zero.Init and never given to an engine keeps [0] placeholder weights. check decides it for TRL's DPOTrainer by
release (0.7.2 prepares the reference with DeepSpeed, trl PR #687); explain names it from the placeholder's
embedding error beside the second model's call."""

from __future__ import annotations

import shlex

from loraflow.explain import diagnose_log
from loraflow.frontends import from_command, parse_versions
from loraflow.frontends.verdict import check_setup

DS = '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}'


def _findings(line: str, versions: str, tmp_path) -> dict[str, bool]:
    config = tmp_path / "ds.json"
    config.write_text(DS)
    argv = shlex.split(line.format(ds=config))
    report = check_setup(lambda v: from_command(list(argv), v), dict(parse_versions(versions)))
    return {f.rule.id: f.holds_if is None for f in report.findings}


# huggingface/trl#669: `accelerate launch dpo.py` with a ZeRO-3 config, full fine-tuning (a second copy as reference).
def test_trl_dpo_reference_outside_deepspeed_before_0_7_2(tmp_path):
    line = ("accelerate launch --num_processes 2 examples/scripts/dpo.py --deepspeed {ds} --output_dir o --bf16")
    assert _findings(line, "trl=0.7.1,transformers=4.34.0", tmp_path).get("zero3-model-outside-engine") is True
    assert "zero3-model-outside-engine" not in _findings(line, "trl=0.7.2,transformers=4.34.0", tmp_path)
    # A LoRA policy's reference is the base with the adapter disabled: no second model.
    lora = line + " --use_peft --lora_r 16"
    assert "zero3-model-outside-engine" not in _findings(lora, "trl=0.7.1,transformers=4.34.0", tmp_path)


# The shape of huggingface/transformers#22705 and diffusers#1865: the step calls the frozen text encoder directly.
LOG = """Traceback (most recent call last):
  File "train_text_to_image.py", line 880, in main
    encoder_hidden_states = text_encoder(batch["input_ids"])[0]
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/sparse.py", line 162, in forward
    return F.embedding(
  File "/usr/lib/python3.10/site-packages/torch/nn/functional.py", line 2233, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
RuntimeError: 'weight' must be 2-D
"""


def test_explain_names_it_from_the_second_model_s_call():
    _, candidates, _ = diagnose_log(LOG + "[deepspeed] zero_optimization.stage=3\n", None)
    assert candidates and candidates[0].rule.id == "zero3-model-outside-engine"
    # Prompt tuning's embedding lookup while PEFT builds the adapter prints the same message: not this rule.
    init = LOG.replace("text_encoder(batch", "model(batch").replace(
        '  File "train_text_to_image.py"', '  File "/x/peft/tuners/prompt_tuning/model.py", line 80, in __init__\n'
        '    init_token_ids = ...\n  File "train_text_to_image.py"')
    _, candidates, _ = diagnose_log(init, None)
    assert not candidates or candidates[0].rule.id != "zero3-model-outside-engine"
