"""Frontends of `loraflow check` feeding the rules written from the mined sample (issue 31): a QLoRA policy synced
into vLLM by merging (TRL --use_vllm --load_in_4bit), Unsloth under a multi-process launch (LLaMA-Factory
use_unsloth, ms-swift --tuner_backend unsloth). Pure parsing, as in test_frontends.py."""

from __future__ import annotations

import json
import shlex

from packaging.version import Version

from loraflow.frontends import from_command, run_check

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "trl": Version("1.16.0")}
TRL_QLORA_GRPO = ("accelerate launch --num_processes 2 trl/scripts/grpo.py --model_name_or_path Qwen/Qwen2.5-7B "
                  "--output_dir out --reward_funcs accuracy_reward --use_vllm --use_peft --load_in_4bit")
SWIFT_UNSLOTH = ("NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora "
                 "--tuner_backend unsloth --dataset alpaca")


def findings(argv: list[str], versions: dict = CURRENT) -> dict[str, str | None]:
    doc = json.loads(run_check(argv, None, [], versions, as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def test_trl_merges_a_qlora_policy_into_its_4bit_weights_for_vllm():
    s = from_command(shlex.split(TRL_QLORA_GRPO), CURRENT).setup
    assert (s.quantization, s.rollout_sync, s.merge_into_quantized) == ("4bit", "merged", True)
    assert findings(shlex.split(TRL_QLORA_GRPO))["kbit-merge"] is None  # unconditional
    plain = TRL_QLORA_GRPO.replace(" --load_in_4bit", "")
    assert "kbit-merge" not in findings(shlex.split(plain))


def test_unsloth_on_two_processes_is_refused_by_releases_before_its_multi_gpu_support(tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\ndo_train: true\n"
                      "finetuning_type: lora\nlora_target: all\nuse_unsloth: true\ndataset: alpaca_en_demo\n"
                      "template: llama3\noutput_dir: out\nbf16: true\n")
    two = ["env", "FORCE_TORCHRUN=1", "NPROC_PER_NODE=2", "llamafactory-cli", "train", str(config)]
    assert findings(two)["unsloth-multi-gpu"] == "unsloth<2026.6.2"
    assert "unsloth-multi-gpu" in findings(two, {**CURRENT, "unsloth": Version("2025.4.1")})
    assert "unsloth-multi-gpu" not in findings(two, {**CURRENT, "unsloth": Version("2026.7.1")})
    assert "unsloth-multi-gpu" not in findings(["env", "CUDA_VISIBLE_DEVICES=0", "llamafactory-cli", "train",
                                                 str(config)])
    # without CUDA_VISIBLE_DEVICES llamafactory-cli starts one process per GPU of the machine (cli.py): it depends
    assert "several GPUs" in findings(["llamafactory-cli", "train", str(config)])["unsloth-multi-gpu"]
    assert findings(shlex.split(SWIFT_UNSLOTH))["unsloth-multi-gpu"] == "unsloth<2026.6.2"
    assert "unsloth-multi-gpu" not in findings(shlex.split(SWIFT_UNSLOTH.replace("unsloth", "peft")))


def test_openrlhf_reward_model_lora_leaves_its_value_head_out_of_the_adapter():
    rm = ("deepspeed --module openrlhf.cli.train_rm --pretrain meta-llama/Meta-Llama-3-8B --lora_rank 16 "
          "--zero_stage 2 --bf16")
    assert from_command(shlex.split(rm), CURRENT).setup.task_head_saved is False
    assert findings(shlex.split(rm))["adapter-omits-new-head"] is None
    assert "adapter-omits-new-head" not in findings(shlex.split(rm.replace("--lora_rank 16", "--lora_rank 0")))
    sft = rm.replace("train_rm", "train_sft")
    assert "adapter-omits-new-head" not in findings(shlex.split(sft))


# The second round's frontend facts: a model family that overflows float16 read from the model's name, an adapter
# initialization or target kind that reads the base weights, and the releases that decide each rule.
def test_an_fp16_run_of_a_family_that_overflows_float16_is_refused_by_name(tmp_path):
    config = tmp_path / "gemma.yaml"
    config.write_text("model_name_or_path: google/gemma-3-4b-it\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
                      "lora_target: all\ndataset: alpaca_en_demo\ntemplate: gemma3\noutput_dir: out\nfp16: true\n")
    assert findings(["llamafactory-cli", "train", str(config)])["fp16-overflow"] is None  # unconditional
    config.write_text(config.read_text().replace("fp16: true", "bf16: true"))
    assert "fp16-overflow" not in findings(["llamafactory-cli", "train", str(config)])
    t5 = ("deepspeed --module openrlhf.cli.train_sft --pretrain google/flan-t5-xl --lora_rank 8 --zero_stage 2 "
          "--save_path out")
    s = from_command(shlex.split(t5), CURRENT).setup
    assert s.fp16_overflows and s.precision == "bf16-mixed"  # OpenRLHF trains in bf16 by default: nothing to say
    assert "fp16-overflow" not in findings(shlex.split(t5))


def test_pissa_init_and_parameter_targets_under_zero3_hold_for_the_peft_releases_before_their_gather(tmp_path):
    config = tmp_path / "pissa.yaml"
    config.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\ndo_train: true\n"
                      "finetuning_type: lora\nlora_target: all\npissa_init: true\n"
                      "deepspeed: examples/deepspeed/ds_z3_config.json\ndataset: alpaca_en_demo\ntemplate: llama3\n"
                      "output_dir: out\nbf16: true\n")
    argv = ["llamafactory-cli", "train", str(config)]
    assert from_command(argv, CURRENT).setup.adapter_reads_base == "svd"
    unknown = {k: v for k, v in CURRENT.items() if k != "peft"}
    assert findings(argv, unknown)["zero3-init-adapter-read"] == "peft<0.12.0"
    assert "zero3-init-adapter-read" not in findings(argv)  # peft 0.21.2 gathers the weight
    trl = ("accelerate launch --config_file zero3.yaml trl/scripts/sft.py --model_name_or_path Qwen/Qwen3-30B-A3B "
           "--use_peft --lora_target_parameters mlp.experts.gate_up_proj --output_dir out")
    s = from_command(shlex.split(trl), CURRENT).setup
    assert (s.adapter_reads_base, s.fp16_overflows) == ("parameters", True)
    swift = ("NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora --init_weights pissa "
             "--deepspeed zero3 --dataset alpaca")
    assert from_command(shlex.split(swift), CURRENT).setup.adapter_reads_base == "svd"
    assert findings(shlex.split(swift), {**CURRENT, "peft": Version("0.11.1")})["zero3-init-adapter-read"] is None


def test_a_4bit_lora_of_a_peft_release_without_4bit_layers_is_a_dtype_mismatch():
    """LLaMA-Factory-13's launch (https://github.com/hiyouga/LlamaFactory/issues/13), with the peft of its day."""
    launch = ("python src/train_sft.py --model_name_or_path /models/bloomz-7b1-mt --do_train --dataset alpaca_gpt4_zh "
              "--finetuning_type lora --quantization_bit 4 --output_dir bloomz_lora --fp16")
    assert "lora-dtype-mismatch" in findings(shlex.split(launch), {**CURRENT, "peft": Version("0.3.0")})
    assert "lora-dtype-mismatch" not in findings(shlex.split(launch), {**CURRENT, "peft": Version("0.4.0")})


def test_a_scripts_own_use_fsdp_with_lora_is_fsdp1_whose_wrapping_its_code_decides():
    # flan-alpaca#10: `python training.py --use_fsdp --use_lora` failed with "FlatParameter requires uniform
    # requires_grad". The script wraps FSDP itself: torch's FullyShardedDataParallel defaults use_orig_params=False
    # (torch/distributed/fsdp/fully_sharded_data_parallel.py), so the mixed unit is a condition, not a certainty.
    argv = ["python", "training.py", "--use_fsdp", "--use_lora", "--model_name_or_path", "google/flan-t5-xl"]
    assert from_command(argv, CURRENT).setup.engine == "fsdp1"
    assert findings(argv)["fsdp1-mixed-requires-grad"]  # holds if the script keeps torch's default
    plain = [a for a in argv if a != "--use_fsdp"]
    assert from_command(plain, CURRENT).setup.engine != "fsdp1"
    assert "fsdp1-mixed-requires-grad" not in findings(plain)
    off = argv[:2] + ["--use_fsdp", "false"] + argv[3:]
    assert from_command(off, CURRENT).setup.engine != "fsdp1"
