"""`loraflow check` on launches posted in public threads, each copied verbatim with its URL: one test per capability a
thread showed missing (a framework fact at its releases, a way launches are posted). Pure parsing, no training."""

from __future__ import annotations

import json
import shlex

from packaging.version import Version

from loraflow.frontends import from_command, run_check


def argv(posted: str) -> list[str]:
    """A posted launch as the shell reads it: continuation lines joined."""
    return shlex.split(" ".join(line.rstrip("\\").strip() for line in posted.splitlines() if line.strip()))


def findings(args: list[str], versions: dict) -> dict[str, str | None]:
    doc = json.loads(run_check(args, None, [], dict(versions), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


# https://github.com/runpod/runpodctl/issues/54 (LLaMA-Factory src/train_bash.py, Dec 2023)
LF_FP16_LORA = r"""CUDA_VISIBLE_DEVICES=0 python src/train_bash.py \
    --stage sft \
    --model_name_or_path openlm-research/open_llama_7b \
    --do_train \
    --dataset train \
    --template default \
    --finetuning_type lora \
    --lora_target q_proj,v_proj \
    --output_dir checkpoint \
    --overwrite_cache \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 4 \
    --lr_scheduler_type cosine \
    --logging_steps 10 \
    --save_steps 2000 \
    --learning_rate 5e-5 \
    --num_train_epochs 3.0 \
    --plot_loss \
    --fp16"""


def test_llama_factory_before_0_4_keeps_the_fp16_adapters_peft_0_7_to_0_11_create():
    """LLaMA-Factory < 0.4.0 loads the base in the compute dtype and does not upcast LoRA (model/adapter.py); PEFT
    0.7 - 0.11 create the adapters in the base's dtype, so fp16 AMP unscales fp16 gradients."""
    old = {"llama-factory": Version("0.3.3"), "peft": Version("0.7.0"), "transformers": Version("4.34.1")}
    assert from_command(argv(LF_FP16_LORA), old).setup.precision == "fp16"
    assert findings(argv(LF_FP16_LORA), old)["fp16-trainable-unscale"] is None
    # PEFT 0.6 created them in float32, LLaMA-Factory 0.4.0 casts what trains to float32.
    assert "fp16-trainable-unscale" not in findings(argv(LF_FP16_LORA), {**old, "peft": Version("0.6.2")})
    new = {**old, "llama-factory": Version("0.4.0"), "transformers": Version("4.36.1")}
    assert from_command(argv(LF_FP16_LORA), new).setup.precision == "fp16-mixed"
    # Unknown releases: the finding names them (train_bash.py dates the run before v0.7.1).
    assert findings(argv(LF_FP16_LORA), {})["fp16-trainable-unscale"] == "llama-factory<0.4.0 and 0.7.0<=peft<0.12.0"
