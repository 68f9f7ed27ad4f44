"""Sweep wild14 (launches posted in public issue threads whose outcome is known): classes of input that
`loraflow check` misread, each with a short synthetic input of the shape a thread showed."""

from __future__ import annotations

import json

from loraflow.frontends import parse_versions, run_check

_ACCEL_FSDP = """distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_offload_params: true
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_use_orig_params: false
mixed_precision: 'no'
num_processes: 2
"""


def _findings(argv: list[str], versions: str) -> tuple[set[str], int]:
    text, code = run_check(argv, None, [], dict(parse_versions(versions)), as_json=True)
    out = json.loads(text)
    return {f["rule"] for f in out.get("findings", [])}, code


def test_script_storage_flag_is_unused_before_bitsandbytes_0_43(tmp_path):
    # huggingface/peft#1923 ran peft's examples/sft/run_peft_qlora_fsdp.sh (`--bnb_4bit_quant_storage_dtype
    # bfloat16` under an FSDP accelerate config) with bitsandbytes 0.41.1: Params4bit had no quant_storage before
    # 0.43.0, so the 4-bit weights stay packed uint8 whatever the flag says, and FSDP cannot shard them.
    cfg = tmp_path / "fsdp_qlora.yaml"
    cfg.write_text(_ACCEL_FSDP)
    argv = ["accelerate", "launch", "--config_file", str(cfg), "train.py", "--model_name_or_path", "m",
            "--bf16", "True", "--use_peft_lora", "True", "--lora_target_modules", "all-linear",
            "--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "bfloat16"]
    old, code = _findings(argv, "transformers=4.42.4,peft=0.11.1,bitsandbytes=0.41.1,accelerate=0.31.0,torch=2.3.1")
    assert "qlora-storage-dtype" in old and code == 2
    new, _ = _findings(argv, "transformers=4.42.4,peft=0.11.1,bitsandbytes=0.43.1,accelerate=0.31.0,torch=2.3.1")
    assert "qlora-storage-dtype" not in new


def test_ms_swift_storage_flag_is_unused_before_bitsandbytes_0_43():
    # The same class on ms-swift's flags (swift/arguments/base_args/quant_args.py passes --bnb_4bit_quant_storage
    # to BitsAndBytesConfig): with bitsandbytes < 0.43 the flag does not reach the 4-bit weights.
    argv = ["swift", "sft", "--model", "Qwen/Qwen2.5-7B-Instruct", "--train_type", "lora", "--quant_bits", "4",
            "--bnb_4bit_quant_storage", "bfloat16", "--torch_dtype", "bfloat16", "--deepspeed", "zero3"]
    old, code = _findings(argv, "ms-swift=2.6.1,transformers=4.42.4,bitsandbytes=0.42.0,deepspeed=0.14.4")
    assert "qlora-storage-dtype" in old and code == 2
    new, _ = _findings(argv, "ms-swift=2.6.1,transformers=4.42.4,bitsandbytes=0.43.3,deepspeed=0.14.4")
    assert "qlora-storage-dtype" not in new


def test_trainer_fsdp_flag_defaults_use_orig_params_false_before_transformers_4_36():
    # lm-sys/FastChat#295 (torchrun train_lora.py --fsdp "full_shard offload auto_wrap", April 2023) and
    # huggingface/transformers#27744 (transformers 4.33.3: `FlatParameter requires uniform requires_grad`): the
    # Trainer's own --fsdp set use_orig_params false unless fsdp_config named it, until transformers PR #27652
    # (4.36.0) made it true. accelerate launch's own default (true) does not apply: TrainingArguments overrides it.
    argv = ["torchrun", "--nproc_per_node", "2", "train.py", "--model_name_or_path", "m", "--use_peft_lora", "True",
            "--fsdp", "full_shard auto_wrap", "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer"]
    old, code = _findings(argv, "transformers=4.33.3,accelerate=0.24.1,torch=2.0.1,peft=0.6.2")
    assert "fsdp1-mixed-requires-grad" in old and code == 2
    new, _ = _findings(argv, "transformers=4.36.0,accelerate=0.25.0,torch=2.1.2,peft=0.7.1")
    assert "fsdp1-mixed-requires-grad" not in new


def test_script_named_for_adapters_decides_its_own_input_grad_hook():
    # artidoro/qlora#12 (2023-08-21): `accelerate launch qlora.py --gradient_checkpointing=True
    # --ddp_find_unused_parameters=False` trained on every GPU with transformers 4.31. A script read as adapter
    # training only from its name builds the adapters itself (QLoRA scripts call prepare_model_for_kbit_training,
    # which hooks the embedding output), so the Trainer's own hook rule is not the fact: ask, do not refuse.
    argv = ["accelerate", "launch", "--num_processes", "2", "qlora.py", "--model_name_or_path", "m",
            "--gradient_checkpointing=True", "--ddp_find_unused_parameters=False"]
    _, code = _findings(argv, "transformers=4.31.0,peft=0.4.0,accelerate=0.21.0,torch=2.0.0,bitsandbytes=0.41.1")
    assert code == 1  # reentrant-frozen-inputs holds only if the script adds no hook: a question, not a refusal
