"""Frontends of `loraflow check`: other frameworks' launch lines and configs -> Combination -> rule findings.

Pure parsing: no model, no process group. Each framework has realistic inputs in the style of its own examples
(tests/fixtures/frontends/<framework>/), at least one where the framework's own defaults decide the outcome, and the
rule ids expected among the findings.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import parse_versions
from loraflow.errors import LoraflowError
from loraflow.frontends import (
    FRAMEWORKS,
    detect,
    flags_for,
    from_command,
    from_files,
    guess_framework_for_files,
    run_check,
)
from loraflow.frontends.argv import parse_flags, split_command
from loraflow.frontends.shell import command_from_script
from loraflow.rules import evaluate
from loraflow.rules.combination import COMBINATION_FIELDS

FIX = ROOT / "tests" / "fixtures" / "frontends"
CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}
OLD = {"torch": Version("2.5.1"), "transformers": Version("4.46.3"), "peft": Version("0.13.2"),
       "deepspeed": Version("0.15.3")}


def fx(*parts: str) -> str:
    return str(FIX.joinpath(*parts))


def ids(result) -> set[str]:
    return {f.rule.id for f in evaluate(result.setup, apply_fixes=False)[1]}


def run(text: str, versions=CURRENT):
    return from_command(shlex.split(text), versions)


def with_versions(text: str, base: dict = CURRENT) -> dict:
    return {**base, **parse_versions(text)}


# ---------------------------------------------------------------- OpenRLHF

OPENRLHF_Z3 = ("deepspeed --num_gpus 8 --module openrlhf.cli.train_sft --pretrain meta-llama/Meta-Llama-3-8B "
               "--dataset Open-Orca/OpenOrca --input_key question --output_key response --max_len 2048 "
               "--zero_stage 3 --bf16 --learning_rate 5e-6 --lora_rank 64 --lora_alpha 64 --gradient_checkpointing")


def test_openrlhf_script_zero3_lora_uses_nonreentrant_default():
    r = from_files("openrlhf", [fx("openrlhf", "train_sft_mistral_lora_z3.sh")], OLD)
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.zero_stage, s.world_size) == ("sft", "lora", "deepspeed", 3, 4)
    assert (s.checkpointing, s.reentrant, s.input_grad_hook) == ("all", False, True)
    assert (s.use_cache, s.packing) == (False, True)
    assert s.precision == "bf16-mixed" and s.adapter_save_gather
    # The default that matters: OpenRLHF checkpoints non-reentrant unless told otherwise.
    assert r.sources["reentrant"].startswith("default (OpenRLHF openrlhf/cli/train_sft.py")
    assert r.flags["reentrant"] == "--gradient_checkpointing_use_reentrant"
    assert r.flags["zero_stage"] == "--zero_stage"
    found = ids(r)
    assert "zero3-frozen-recompute" in found
    assert "packing-cache-cross-attention" not in found  # OpenRLHF turns use_cache off
    assert r.unknown == []


def test_openrlhf_versions_decide_zero3_recompute():
    old = run(OPENRLHF_Z3, with_versions("deepspeed=0.15.3"))
    new = run(OPENRLHF_Z3, with_versions("deepspeed=0.19.8"))
    assert "zero3-frozen-recompute" in ids(old)
    assert "zero3-frozen-recompute" not in ids(new)
    fixed = run(OPENRLHF_Z3 + " --gradient_checkpointing_use_reentrant", with_versions("deepspeed=0.15.3"))
    assert fixed.setup.reentrant is True and "zero3-frozen-recompute" not in ids(fixed)


def test_openrlhf_defaults_full_finetune_on_zero2():
    r = run("python -m openrlhf.cli.train_sft --pretrain Qwen/Qwen2.5-0.5B --dataset x --gradient_checkpointing")
    s = r.setup
    assert (s.adapter, s.zero_stage, s.engine, s.world_size) == ("full", 2, "deepspeed", 1)
    assert "default (OpenRLHF" in r.sources["zero_stage"] and "--lora_rank 0" in r.sources["adapter"]
    assert not ids(r) & {"zero3-frozen-recompute", "reentrant-frozen-inputs"}


def test_openrlhf_dotted_dpo_script_qlora_on_zero3():
    r = from_files("openrlhf", [fx("openrlhf", "train_dpo_qwen_dotted.sh")], OLD)
    s = r.setup
    assert (s.stage, s.world_size, s.zero_stage, s.reentrant, s.forwards_per_step) == ("dpo", 8, 3, True, 1)
    assert (s.quantization, s.quant_storage_matches, s.precision) == ("4bit", False, "bf16-mixed")
    assert r.flags["reentrant"] == "--model.gradient_checkpointing_reentrant" and r.unknown == []
    found = ids(r)
    assert "qlora-storage-dtype" in found  # OpenRLHF sets no bnb_4bit_quant_storage
    assert "zero3-frozen-recompute" not in found  # reentrant requested


def test_openrlhf_dotted_ppo_ray_grpo_and_empty_targets():
    r = run("ray job submit --address=http://127.0.0.1:8265 -- python3 -m openrlhf.cli.train_ppo_ray "
            "--actor.num_nodes 1 --actor.num_gpus_per_node 4 --vllm.num_engines 2 --ds.zero_stage 3 "
            "--actor.gradient_checkpointing_enable --ds.lora.rank 64 --algo.advantage.estimator group_norm")
    s = r.setup
    assert (s.stage, s.world_size, s.generation, s.reentrant) == ("grpo", 4, False, False)
    assert r.flags["reentrant"] == "--actor.gradient_checkpointing_reentrant"
    assert r.flags["zero_stage"] == "--ds.zero_stage"
    empty = run("torchrun --nproc_per_node=2 -m openrlhf.cli.train_dpo --ds.zero_stage 2 --ds.lora.rank 16 "
                "--ds.lora.target_modules --model.gradient_checkpointing_enable")
    assert empty.setup.matched_modules == 0 and empty.setup.forwards_per_step == 1
    assert "no-adapter-matched" in ids(empty)


# ---------------------------------------------------------------- DeepSpeed-Chat

def test_deepspeed_chat_step1_llama_with_default_lora_scope():
    script = fx("deepspeed-chat", "step1_supervised_finetuning", "run_llama2_13b_lora.sh")
    r = from_files("deepspeed-chat", [script], {**CURRENT, "deepspeed": Version("0.15.3")})
    s = r.setup
    assert (s.stage, s.zero_stage, s.adapter, s.precision) == ("sft", 3, "lora", "fp16-mixed")
    # --lora_module_name defaults to OPT's "decoder.layers.": nothing in a Llama matches it.
    assert s.matched_modules == 0
    assert "no-adapter-matched" in ids(r)
    # transformers >= 5 checkpoints non-reentrant when DeepSpeed-Chat passes no kwargs.
    assert s.reentrant is False and "zero3-frozen-recompute" in ids(r)
    older = from_files("deepspeed-chat", [script], OLD)
    assert older.setup.reentrant is True and older.setup.input_grad_hook is True
    assert not ids(older) & {"zero3-frozen-recompute", "reentrant-frozen-inputs"}


def test_deepspeed_chat_step3_without_hybrid_engine():
    r = from_files("deepspeed-chat", [fx("deepspeed-chat", "step3_rlhf_finetuning", "run_opt_1.3b_lora.sh")], CURRENT)
    s = r.setup
    assert (s.stage, s.world_size, s.zero_stage, s.generation, s.generation_gather) == ("ppo", 8, 3, True, False)
    assert s.adapter == "full"  # no --only_optimize_lora: base weights train too
    assert "zero3-generation-gather" in ids(r)
    hybrid = run("deepspeed --num_gpus 8 main.py --actor_model_name_or_path facebook/opt-1.3b --actor_zero_stage 3 "
                 "--critic_zero_stage 3 --actor_lora_dim 64 --only_optimize_lora --enable_hybrid_engine --deepspeed")
    assert hybrid.setup.generation_gather is True and "zero3-generation-gather" not in ids(hybrid)


def test_deepspeed_chat_only_optimize_lora_on_old_transformers_is_clean():
    r = run("deepspeed --num_gpus 2 main.py --model_name_or_path meta-llama/Llama-2-7b-hf --zero_stage 2 "
            "--gradient_checkpointing --lora_dim 128 --lora_module_name layers. --only_optimize_lora --dtype bf16 "
            "--deepspeed --data_split 2,4,4", OLD)
    s = r.setup
    assert (s.reentrant, s.input_grad_hook, s.matched_modules, s.precision) == (True, True, None, "bf16-mixed")
    assert r.unknown == [] and not {"crash", "silent"} & {f.rule.impact for f in evaluate(s, apply_fixes=False)[1]}


def test_deepspeed_chat_defaults_zero0_fp16():
    r = run("deepspeed main.py --model_name_or_path facebook/opt-1.3b --lora_dim 8 --only_optimize_lora "
            "--data_split 2,4,4")
    s = r.setup
    assert (s.engine, s.zero_stage, s.precision, s.checkpointing, s.matched_modules) == (
        "deepspeed", 0, "fp16-mixed", "off", None)
    assert "--zero_stage default 0" in r.sources["zero_stage"] and "--dtype fp16" in r.sources["precision"]
    assert r.flags["zero_stage"] == "--zero_stage" and r.flags["checkpointing"] == "--gradient_checkpointing"


# ---------------------------------------------------------------- HF Trainer / TRL

def test_trl_recipe_file_alone_uses_trl_defaults():
    r = from_files("hf", [fx("hf", "sft_qwen_lora.yaml")], CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.checkpointing, s.reentrant, s.precision) == (
        "sft", "lora", "single", "all", False, "bf16-mixed")
    assert "TRL >= 0.27 sets use_reentrant=False" in r.sources["reentrant"]
    assert r.flags["reentrant"] == "gradient_checkpointing_kwargs: {use_reentrant: ...}"
    assert r.unknown == [] and ids(r) == set()


def test_trl_cli_recipe_on_zero3_gets_trl_workaround():
    line = f"trl sft --config {fx('hf', 'sft_qwen_lora.yaml')} --accelerate_config zero3"
    r = run(line, with_versions("transformers=4.57.1,trl=0.28.0", OLD))
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.zero_stage, s.world_size) == ("sft", "lora", "deepspeed", 3, 8)
    # TRL defaults: checkpointing on, bf16 on; and it forces reentrant + the input hook for PEFT + ZeRO-3.
    assert s.checkpointing == "all" and "trl/trainer/base_config.py" in r.sources["checkpointing"]
    assert (s.reentrant, s.input_grad_hook, s.use_cache, s.packing) == (True, True, False, True)
    assert s.precision == "bf16-mixed"
    assert not ids(r) & {"zero3-frozen-recompute", "packing-cache-cross-attention", "reentrant-frozen-inputs"}
    assert "inferred" in r.sources["engine"]
    # No trl version: the TRL that installs with transformers 4.46 (< 0.19): no checkpointing or bf16 by default.
    era = run(line, OLD)
    assert era.setup.checkpointing == "off" and era.eras["trl"][0] == ">=0.8.0,<=0.18.2"
    # The recipe's `dtype` key (TRL >= 0.23) disagrees with what installs beside transformers 4.46: the versions given
    # stand, and the report says the spelling does not fit them.
    assert any(n.startswith("trl: --dtype exists in TRL >=0.23.0, which no release") for n in era.notes)


def test_hf_trainer_ddp_reentrant_default_depends_on_transformers():
    line = (f"accelerate launch --config_file {fx('hf', 'accelerate_multi_gpu.yaml')} train.py "
            "--model_name_or_path meta-llama/Llama-3.1-8B --output_dir out --gradient_checkpointing --bf16")
    old, new = run(line, OLD), run(line, CURRENT)  # no PEFT flag: full fine-tuning, nothing to find
    assert (old.setup.engine, old.setup.world_size, old.setup.adapter) == ("ddp", 4, "full")
    assert old.setup.reentrant is True and new.setup.reentrant is False and not ids(old) | ids(new)
    old, new = run(line + " --use_peft --lora_r 16", OLD), run(line + " --use_peft --lora_r 16", CURRENT)
    assert (old.setup.find_unused_parameters, old.setup.reentrant, new.setup.reentrant) == (True, True, False)
    assert "ddp-reentrant-unused" in ids(old) and "ddp-reentrant-unused" not in ids(new)
    assert old.flags["reentrant"].startswith("--gradient_checkpointing_kwargs")


def test_hf_trainer_deepspeed_json_and_unknown_flag():
    line = (f"torchrun --nproc_per_node 8 train.py --deepspeed {fx('hf', 'ds_zero3.json')} --gradient_checkpointing "
            "True --gradient_checkpointing_kwargs '{\"use_reentrant\": false}' --bf16 --output_dir out "
            "--report_to wandb tensorboard --weird_flag 1 --use_peft --lora_r 16")
    r = run(line, OLD)
    assert (r.setup.zero_stage, r.setup.precision, r.setup.reentrant) == (3, "bf16-mixed", False)
    assert r.unknown == ["--weird_flag 1"]
    assert {"zero3-frozen-recompute", "zero3-empty-adapter-save"} <= ids(r)
    # transformers >= 5 gathers the adapter on save and deepspeed >= 0.19.3 fixed the recompute.
    assert not ids(run(line, CURRENT)) & {"zero3-frozen-recompute", "zero3-empty-adapter-save"}


def test_trl_dpo_yaml_dora_on_zero3():
    # DPOTrainer forces reentrant for PEFT + ZeRO-3 only since TRL 1.9 (PR #6356; SFT since 0.28, PR #4951).
    r = from_files("hf", [fx("hf", "dpo_dora_zero3.yaml")], with_versions("transformers=4.57.1,trl=1.9.0", OLD))
    s = r.setup
    assert (s.stage, s.adapter, s.forwards_per_step, s.reentrant) == ("dpo", "dora", 1, True)
    assert any("overrides use_reentrant=false" in n for n in r.notes)
    assert {"dora-sharded-weight", "zero3-empty-adapter-save"} <= ids(r)
    older = from_files("hf", [fx("hf", "dpo_dora_zero3.yaml")], with_versions("transformers=4.57.1,trl=1.8.0", OLD))
    assert older.setup.reentrant is False and "zero3-frozen-recompute" in ids(older)
    assert r.flags["reentrant"] == "gradient_checkpointing_kwargs: {use_reentrant: ...}"


def test_trl_grpo_generation_and_vllm():
    base = "trl grpo --model_name_or_path Qwen/Qwen2.5-0.5B --use_peft --num_processes 2 --use_deepspeed --zero_stage 3"
    r = run(base + " --ds3_gather_for_generation false")
    s = r.setup
    assert (s.stage, s.generation, s.generation_gather, s.world_size) == ("grpo", True, False, 2)
    assert "zero3-generation-gather" in ids(r)
    assert run(base + " --use_vllm").setup.generation is False


def test_transformers_example_script_is_not_trl_and_trains_every_weight():
    r = run("torchrun --nproc_per_node 2 run_clm.py --model_name_or_path gpt2 --dataset_name wikitext "
            "--dataset_config_name wikitext-2-raw-v1 --block_size 512 --do_train --output_dir out")
    s = r.setup  # no TRL defaults (checkpointing, bf16) and run_clm.py's own flags are known
    assert (s.checkpointing, s.precision, s.adapter, r.unknown) == ("off", "fp32", "full", [])
    assert any("full fine-tuning" in n and "--use_peft --lora_r 16" in n for n in r.notes)
    line = f"torchrun --nproc_per_node 2 train.py --deepspeed {fx('hf', 'ds_zero3.json')} --gradient_checkpointing"
    assert ids(run(line, with_versions("deepspeed=0.15.3"))) == set()  # a full fine-tune has no frozen weights
    lora = run(line + " --use_peft --lora_r 16", with_versions("deepspeed=0.15.3,trl=0.27.0"))
    assert lora.setup.adapter == "lora" and "zero3-frozen-recompute" in ids(lora)


# ---------------------------------------------------------------- LLaMA-Factory

def test_llama_factory_yaml_with_shipped_ds3_name():
    r = from_files("llama-factory", [fx("llama-factory", "llama3_lora_sft_ds3.yaml")], OLD)
    s = r.setup
    assert (s.stage, s.adapter, s.zero_stage, s.precision) == ("sft", "lora", 3, "bf16-mixed")
    # LLaMA-Factory's own defaults: checkpointing on, reentrant, hidden-state input marked as requiring grad.
    assert (s.checkpointing, s.reentrant, s.input_grad_hook, s.use_cache) == ("all", True, True, False)
    assert "model_args.py" in r.sources["reentrant"] and "model_args.py" in r.sources["checkpointing"]
    assert any("ds_z3_config.json is not on this machine" in n for n in r.notes)
    assert s.adapter_save_gather is True  # the shipped ds_z3_config.json gathers 16-bit weights
    assert not {"crash", "silent"} & {f.rule.impact for f in evaluate(s, apply_fixes=False)[1]}


def test_llama_factory_dora_dpo_nonreentrant_zero3():
    r = from_files("llama-factory", [fx("llama-factory", "qwen_dora_dpo_z3.yaml")], OLD)
    s = r.setup
    assert (s.stage, s.adapter, s.reentrant, s.offload, s.forwards_per_step) == ("dpo", "dora", False, True, 1)
    assert {"zero3-frozen-recompute", "dora-sharded-weight"} <= ids(r)
    assert r.flags["reentrant"] == "use_reentrant_gc"


def test_llama_factory_cli_overrides_and_world_size():
    r = run(f"FORCE_TORCHRUN=1 NNODES=1 NPROC_PER_NODE=4 llamafactory-cli train "
            f"{fx('llama-factory', 'llama3_lora_sft_ds3.yaml')} disable_gradient_checkpointing=true bogus_key=1")
    assert (r.setup.world_size, r.setup.checkpointing) == (4, "off")
    assert r.unknown == ["bogus_key=1"]
    ddp = run("CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train --model_name_or_path Qwen/Qwen2.5-7B --stage sft "
              "--do_train --finetuning_type lora --lora_target all --dataset alpaca_en_demo --template qwen "
              "--output_dir out --bf16")
    s = ddp.setup
    assert (s.engine, s.world_size, s.reentrant, s.find_unused_parameters) == ("ddp", 2, True, False)
    assert "ddp-reentrant-unused" not in ids(ddp)  # LLaMA-Factory sets find_unused_parameters=False for LoRA


# ---------------------------------------------------------------- ms-swift

def test_ms_swift_grpo_on_zero3_without_gather():
    r = from_files("ms-swift", [fx("ms-swift", "grpo_lora_zero3.sh")], CURRENT)
    s = r.setup
    assert (s.stage, s.world_size, s.zero_stage, s.generation, s.generation_gather) == ("grpo", 4, 3, True, False)
    assert (s.checkpointing, s.reentrant, s.input_grad_hook) == ("all", True, True)
    assert "zero3-generation-gather" in ids(r)
    assert r.flags["generation_gather"] == "--ds3_gather_for_generation"


def test_ms_swift_reentrant_default_depends_on_ddp():
    r = from_files("ms-swift", [fx("ms-swift", "sft_ddp_reentrant.sh")], CURRENT)
    assert (r.setup.engine, r.setup.reentrant, r.setup.find_unused_parameters) == ("ddp", True, True)
    assert "ddp-reentrant-unused" in ids(r)
    ddp_default = run("NPROC_PER_NODE=2 swift sft --model Qwen/Qwen2.5-7B-Instruct --dataset x --train_type lora")
    assert ddp_default.setup.reentrant is False and "swift/trainers/mixin.py" in ddp_default.sources["reentrant"]
    assert "ddp-reentrant-unused" not in ids(ddp_default)
    single = run("swift sft --model Qwen/Qwen2.5-7B-Instruct --dataset x --deepspeed zero3_offload")
    assert (single.setup.world_size, single.setup.reentrant, single.setup.offload) == (1, True, True)
    switches = run("swift sft --model M --use_dora --packing")  # bare switches are true
    assert (switches.setup.adapter, switches.setup.packing) == ("dora", True)
    assert run("swift rlhf --rlhf_type grpo --use_vllm").setup.generation is False


# ---------------------------------------------------------------- Axolotl

def test_axolotl_lora_zero3_reads_json_next_to_yaml():
    r = from_files("axolotl", [fx("axolotl", "llama3_lora_zero3.yml")], CURRENT)
    s = r.setup
    assert (s.adapter, s.engine, s.zero_stage, s.packing, s.use_cache) == ("lora", "deepspeed", 3, True, False)
    assert s.precision == "bf16-mixed" and "bf16.enabled" in r.sources["precision"]
    # Axolotl's default for SFT: {use_reentrant: true}, with enable_input_require_grads for adapters.
    assert (s.reentrant, s.input_grad_hook) == (True, True) and "utils/config" in r.sources["reentrant"]
    assert r.unknown == []
    assert not {"crash", "silent"} & {f.rule.impact for f in evaluate(s, apply_fixes=False)[1]}


def test_axolotl_qlora_dora_fsdp1():
    r = from_files("axolotl", [fx("axolotl", "qwen_qlora_dora_fsdp1.yml")], CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.quantization, s.fsdp_use_orig_params) == ("dpo", "dora", "fsdp1", "4bit",
                                                                                      False)
    assert (s.embeddings_trainable, s.lm_head_trainable, s.reentrant, s.offload) == (True, True, False, True)
    # transformers >= 4.39 with peft >= 0.11: the Trainer wraps the adapters in FSDP units of their own.
    assert "fsdp1-mixed-requires-grad" not in ids(r) and r.setup.fsdp_frozen_units_separate
    older = from_files("axolotl", [fx("axolotl", "qwen_qlora_dora_fsdp1.yml")], with_versions("transformers=4.38.2"))
    assert {"fsdp1-mixed-requires-grad", "fsdp1-mixed-dtype"} <= ids(older)
    assert "dora-sharded-weight" in ids(from_files("axolotl", [fx("axolotl", "qwen_qlora_dora_fsdp1.yml")],
                                                   with_versions("peft=0.11.1")))
    assert r.unknown == ["qwen_qlora_dora_fsdp1.yml: unknown_axolotl_key"]


def test_axolotl_yaml_plus_deepspeed_json_given_alongside(tmp_path):
    cfg = tmp_path / "cfg.yml"
    cfg.write_text("adapter: lora\nlora_target_linear: true\ngradient_checkpointing: true\n"
                   "deepspeed: /nowhere/custom_zero3.json\n")
    ds = tmp_path / "zero2.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    r = from_files("axolotl", [str(ds), str(cfg)], CURRENT)
    assert (r.setup.zero_stage, r.setup.offload, r.setup.reentrant) == (2, True, True)


def test_axolotl_cli_launcher_args():
    r = run(f"axolotl train {fx('axolotl', 'llama3_lora_zero3.yml')} --learning-rate 1e-4 -- --num_processes 4")
    assert (r.setup.world_size, r.setup.zero_stage) == (4, 3) and r.unknown == []


# ---------------------------------------------------------------- DeepSpeed JSON

def test_deepspeed_json_zero3_offload_without_gather():
    r = from_files("deepspeed", [fx("deepspeed", "zero3_offload_auto.json")], CURRENT)
    s = r.setup
    assert (s.engine, s.zero_stage, s.offload, s.adapter_save_gather, s.precision) == ("deepspeed", 3, True, False,
                                                                                     "fp32")
    assert "zero3-empty-adapter-save" in ids(r)
    assert any("auto" in n for n in r.notes)
    assert r.unknown == [f"{fx('deepspeed', 'zero3_offload_auto.json')}: zero_magic_knob"]
    assert r.flags["adapter_save_gather"] == "zero_optimization.stage3_gather_16bit_weights_on_model_save"


def test_deepspeed_json_defaults_and_zero2_bf16_hybrid_engine(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"overlap_comm": True}, "fp16": {"enabled": True}}))
    r = from_files("deepspeed", [str(path)], CURRENT)
    assert (r.setup.zero_stage, r.setup.precision, r.setup.offload) == (0, "fp16-mixed", False)
    assert r.sources["zero_stage"].startswith("default (DeepSpeed")
    r = from_files("deepspeed", [fx("deepspeed", "zero2_bf16.json")], CURRENT)
    assert (r.setup.zero_stage, r.setup.precision, r.setup.generation_gather) == (2, "bf16-mixed", True)
    assert ids(r) == set()


# ---------------------------------------------------------------- detection, errors, report

@pytest.mark.parametrize("line,framework", [
    ("deepspeed --module openrlhf.cli.train_dpo --zero_stage 3", "openrlhf"),
    ("torchrun --nproc_per_node 8 -m openrlhf.cli.train_rm --zero_stage 3", "openrlhf"),
    ("deepspeed main.py --lora_dim 128 --only_optimize_lora --zero_stage 3", "deepspeed-chat"),
    ("deepspeed --num_gpus 1 main.py --model_name_or_path facebook/opt-1.3b --data_split 2,4,4", "deepspeed-chat"),
    ("trl dpo --model_name_or_path x --use_peft", "hf"),
    ("accelerate launch --num_processes 2 train.py --output_dir out --gradient_checkpointing", "hf"),
    ("llamafactory-cli train examples/train_lora/llama3_lora_sft.yaml", "llama-factory"),
    ("NPROC_PER_NODE=4 swift rlhf --rlhf_type dpo --model x", "ms-swift"),
    ("axolotl train examples/llama-3/lora-1b.yml", "axolotl"),
    ("accelerate launch -m axolotl.cli.train examples/llama-3/lora-1b.yml", "axolotl"),
])
def test_detect_launch_lines(line, framework):
    assert detect(shlex.split(line)) == framework
    assert framework in FRAMEWORKS


def test_flags_for_every_framework_name_setup_fields():
    for name in FRAMEWORKS:
        flags = flags_for(name)
        assert flags and set(flags) <= set(COMBINATION_FIELDS), name
    assert flags_for("openrlhf")["reentrant"] == "--gradient_checkpointing_use_reentrant"
    assert flags_for("llama-factory")["reentrant"] == "use_reentrant_gc"


@pytest.mark.parametrize("case", yaml.safe_load((FIX / "bad_inputs.yaml").read_text()), ids=lambda c: c["error"])
def test_bad_inputs_name_the_flag_key_or_file(tmp_path, case):
    for name, content in case.get("files", {}).items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(LoraflowError) as err:
        if "command" in case:
            run(case["command"])
        else:
            from_files(case["framework"], [str(tmp_path / name) for name in case["files"]], CURRENT)
    assert case["error"] in str(err.value)


def test_guess_framework_for_files(tmp_path):
    cases = {"axolotl/llama3_lora_zero3.yml": "axolotl", "hf/sft_qwen_lora.yaml": "hf",
             "llama-factory/llama3_lora_sft_ds3.yaml": "llama-factory", "deepspeed/zero2_bf16.json": "deepspeed"}
    for path, name in cases.items():
        assert guess_framework_for_files([fx(path)]) == name
    own = tmp_path / "mine.yaml"  # loraflow's own config with a typo is not another framework's
    own.write_text("stage: sft\nadapter: {rank: 8}\ndatasets: x\ntrain: {max_steps: 10}\n")
    assert guess_framework_for_files([str(own)]) is None
    assert guess_framework_for_files([str(tmp_path / "missing.yaml")]) is None


def test_run_check_json_text_and_exit_codes():
    text, code = run_check(shlex.split(OPENRLHF_Z3), None, [], OLD, as_json=True)
    doc = json.loads(text)
    assert code == doc["exit_code"] == 2
    assert doc["framework"] == "openrlhf" and doc["setup"]["zero_stage"] == 3
    finding = next(f for f in doc["findings"] if f["rule"] == "zero3-frozen-recompute")
    assert finding["impact"] == "crash" and finding["cause"] and finding["fix_loraflow"]
    assert any("--gradient_checkpointing_use_reentrant" in fix for fix in finding["fix_here"])
    assert set(finding) >= {"rule", "title", "impact", "cause", "fix_here", "fix_loraflow", "notes", "references"}
    # Only an unread flag: exit code 1. Nothing at all: 0.
    _, code = run_check(shlex.split(OPENRLHF_Z3 + " --made_up_flag"), None, [], CURRENT, as_json=False)
    assert code == 1
    text, code = run_check(shlex.split(OPENRLHF_Z3), None, [], CURRENT, as_json=False)
    assert code == 0 and "exit code 0" in text and "--zero_stage 3" in text
    with pytest.raises(LoraflowError, match="not both"):
        run_check(["deepspeed", "main.py"], "deepspeed-chat", ["x.sh"], CURRENT, False)
    text, code = run_check(None, "ms-swift", [fx("ms-swift", "sft_ddp_reentrant.sh")], CURRENT, as_json=False)
    assert code == 2
    assert "[crash] ddp-reentrant-unused" in text
    assert "change --ddp_find_unused_parameters (find_unused_parameters is now True)" in text


def test_argv_parsing_forms():
    args, positionals, after = parse_flags(["pos", "--a=1", "--b", "2", "--c", "--d", "x", "y", "--", "--e"],
                                           switches={"c"}, lists={"d"})
    assert [(a.name, a.value) for a in args] == [("a", "1"), ("b", "2"), ("c", None), ("d", ["x", "y"])]
    assert positionals == ["pos"] and after == ["--e"]
    cmd = split_command(shlex.split("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 --nnodes 2 -m pkg.mod --x 1"))
    assert (cmd.env, cmd.launcher, cmd.program, cmd.program_kind, cmd.world_size) == (
        {"CUDA_VISIBLE_DEVICES": "0,1"}, "torchrun", "pkg.mod", "module", 4)
    assert split_command(["python", "-m", "torch.distributed.run", "--nproc_per_node", "3", "t.py"]).world_size == 3
    assert split_command(shlex.split("deepspeed --include localhost:0,1,2 main.py")).world_size == 3
    # Cluster launchers in front: their options are skipped up to the program; mpirun's -np is the process count.
    cmd = split_command(shlex.split("srun -N 2 --gres=gpu:8 -l torchrun --nproc_per_node 8 --nnodes 2 t.py --x 1"))
    assert (cmd.launcher, cmd.program, cmd.world_size, cmd.args) == ("torchrun", "t.py", 16, ["--x", "1"])
    cmd = split_command(shlex.split("mpirun -np 4 -x NCCL_DEBUG=INFO --allow-run-as-root python t.py"))
    assert (cmd.launcher, cmd.program, cmd.world_size) == ("python", "t.py", 4)
    with pytest.raises(LoraflowError, match="launches nothing loraflow reads"):
        split_command(["srun", "-N", "2", "hostname"])
    r = run("CUDA_VISIBLE_DEVICES=0,1,2 deepspeed main.py --model_name_or_path facebook/opt-350m --lora_dim 8 "
            "--data_split 2,4,4")
    assert (r.setup.world_size, r.sources["world_size"]) == (3, "CUDA_VISIBLE_DEVICES=0,1,2")


def test_script_reader_expands_variables_and_drops_redirects():
    tokens = command_from_script(fx("deepspeed-chat", "step3_rlhf_finetuning", "run_opt_1.3b_lora.sh"))
    assert tokens[:3] == ["deepspeed", "--num_gpus", "8"]
    assert "--actor_zero_stage" in tokens and tokens[tokens.index("--actor_zero_stage") + 1] == "3"
    assert "&>" not in tokens and "facebook/opt-1.3b" in tokens
    r = run(f"bash {fx('openrlhf', 'train_sft_mistral_lora_z3.sh')}")
    assert r.framework == "openrlhf" and r.setup.zero_stage == 3


def test_llama_factory_bare_switch_on_the_command_line_is_on():

    from loraflow.frontends import from_command

    yaml = FIX / "llama-factory/llama3_lora_sft_ds3.yaml"
    result = from_command(["llamafactory-cli", "train", str(yaml), "--use_dora"], {})
    assert result.setup.adapter == "dora"


# ---------------------------------------------------------------- what a launch line does not say

def _findings(text: str, versions=None) -> dict[str, str | None]:
    doc = json.loads(run_check(shlex.split(text), None, [], versions or {}, as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


DOTTED = ("deepspeed --module openrlhf.cli.train_sft --model.model_name_or_path m --ds.zero_stage 3 "
          "--model.gradient_checkpointing_enable --ds.lora.rank 16")


def test_versions_not_given_make_version_gated_findings_conditional():
    """No --versions: another framework's run is not checked against this machine's packages. Dotted flags mean
    OpenRLHF >= 0.10.2, whose releases pin DeepSpeed on both sides of the fix (0.11.0 pins 0.19.5)."""
    doc = json.loads(run_check(shlex.split(DOTTED), None, [], {}, as_json=True)[0])
    assert doc["inferred_eras"]["openrlhf"]["range"] == ">=0.10.2"
    assert {f["rule"]: f["holds_if"] for f in doc["findings"]}["zero3-frozen-recompute"] == "deepspeed<0.19.3"
    assert _findings(DOTTED, with_versions("deepspeed=0.15.3", {}))["zero3-frozen-recompute"] is None
    assert "zero3-frozen-recompute" not in _findings(DOTTED, with_versions("deepspeed=0.19.8", {}))
    # A release named instead: its pins decide.
    assert _findings(DOTTED, with_versions("openrlhf=0.10.3", {}))["zero3-frozen-recompute"] is None
    assert "zero3-frozen-recompute" not in _findings(DOTTED, with_versions("openrlhf=0.11.0", {}))


def test_flat_flags_date_a_command_to_releases_that_all_pin_an_affected_deepspeed():
    doc = json.loads(run_check(shlex.split(OPENRLHF_Z3), None, [], {}, as_json=True)[0])
    assert doc["inferred_eras"]["openrlhf"]["range"].startswith(">=0.3.6")
    assert {f["rule"]: f["holds_if"] for f in doc["findings"]}["zero3-frozen-recompute"] is None
    assert doc["exit_code"] == 2


def test_frameworks_change_their_defaults_per_release():
    # OpenRLHF checkpointed reentrant with no input-grad hook before v0.1.5: the hook came first, reentrancy later.
    old = from_command(shlex.split(OPENRLHF_Z3.replace("--module openrlhf.cli.train_sft", "../train_sft.py")),
                       with_versions("openrlhf=0.1.4", {}))
    assert (old.setup.reentrant, old.setup.input_grad_hook, old.setup.merge_in_sharded) == (True, False, True)
    # DeepSpeed-Chat added the input-grad hook for --only_optimize_lora on 2023-08-03 (PR #658).
    line = ("deepspeed main.py --model_name_or_path facebook/opt-1.3b --gradient_checkpointing --only_optimize_lora "
            "--lora_dim 128 --zero_stage 2")
    assert not from_command(shlex.split(line), with_versions("deepspeed-chat=2023-04-20", {})).setup.input_grad_hook
    assert from_command(shlex.split(line), with_versions("deepspeed-chat=2023-09-01", {})).setup.input_grad_hook


def test_zero3_eval_backward_can_fire_from_check():
    """TRL 0.20 - 0.23 GRPO with use_transformers_paged leaves the policy in eval mode; DeepSpeed <= 0.15.3
    asserts on it under ZeRO-3."""
    line = ("accelerate launch --config_file zero3.yaml -m trl.scripts.grpo --use_peft --lora_r 16 "
            "--use_transformers_paged --gradient_checkpointing")
    found = _findings(line, with_versions("deepspeed=0.15.3,trl=0.21.0", {}))
    assert found["zero3-eval-backward"] is None
    assert "zero3-eval-backward" not in _findings(line, with_versions("deepspeed=0.15.3,trl=0.24.0", {}))


def test_a_missing_deepspeed_config_is_read_from_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = from_command(shlex.split("deepspeed train.py --deepspeed configs/ds_config_zero3_offload.json --bf16 "
                                 "--output_dir o --use_peft --lora_r 8 --gradient_checkpointing"), CURRENT)
    assert (r.setup.engine, r.setup.zero_stage, r.setup.offload) == ("deepspeed", 3, True)
    assert any("read from its name" in n for n in r.notes)
    # No stage in the name: every stage is evaluated, and findings say which one they need.
    doc = json.loads(run_check(shlex.split("deepspeed train.py --deepspeed ds_config.json --output_dir o --use_peft "
                                           "--lora_r 8 --gradient_checkpointing --gradient_checkpointing_kwargs "
                                           "'{\"use_reentrant\": false}'"), None, [],
                                 {"deepspeed": Version("0.15.3"), "trl": Version("0.20.0")}, as_json=True)[0])
    holds = {f["rule"]: f["holds_if"] for f in doc["findings"]}
    assert "ZeRO stage 3" in holds["zero3-frozen-recompute"]


def test_a_scripts_own_flags_say_adapter_quantization_and_reentrancy():
    """PEFT's example scripts, vendors' finetune_lora.sh: not the HF Trainer's flags, but common spellings."""
    r = from_command(shlex.split("torchrun --nproc_per_node 8 finetune.py --model_name_or_path openbmb/MiniCPM-V-2_6 "
                                 "--use_lora true --tune_vision true --tune_llm false --use_4bit_quantization true "
                                 "--use_reentrant false --gradient_checkpointing true --deepspeed ds_config_zero3.json "
                                 "--output_dir o"), CURRENT)
    s = r.setup
    assert (s.adapter, s.quantization, s.reentrant, s.frozen_modules, s.zero_stage) == ("lora", "4bit", False, True, 3)
    assert "--use_lora true (inferred from the script's own flag)" in r.sources["adapter"]
    assert not [u for u in r.unknown if "use_lora" in u or "tune_vision" in u]


def test_check_json_names_each_findings_version_condition():
    doc = json.loads(run_check(shlex.split(DOTTED), None, [], {}, as_json=True)[0])
    finding = next(f for f in doc["findings"] if f["rule"] == "zero3-frozen-recompute")
    assert finding["holds_if"] == "deepspeed<0.19.3" and finding["decided_by"] == ["deepspeed"]
    assert finding["affected"] == {"deepspeed": "<0.19.3"} and finding["fixed_in"]
    assert any("--versions deepspeed=X.Y.Z" in n for n in finding["notes"])
    assert {u["name"] for u in doc["unknowns"]} == {"deepspeed"}


def test_each_framework_is_declared_once():
    from loraflow.frontends import framework, framework_of_log, frameworks

    names = [f.name for f in frameworks()]
    assert names == list(FRAMEWORKS) and len(set(names)) == len(names)
    for f in frameworks():
        # Only the config formats (a DeepSpeed JSON, an accelerate YAML) and Python scripts (hf.py reads a script's
        # launch line) have no command line of their own.
        formats = ("deepspeed", "accelerate", "python-script")
        assert f.flags and f.title and (f.recognise is not None or f.name in formats), f.name
    assert framework("openrlhf").depends
    assert framework_of_log('File "/x/site-packages/openrlhf/trainer/dpo_trainer.py", line 1, in fit') == "openrlhf"


def test_vendor_script_with_nested_training_args_and_peft_sections(tmp_path, monkeypatch):
    # GLM-4's finetune.py style: positional data dir, model and a YAML whose TrainingArguments sit under
    # `training_args:` and whose PEFT config sits under `peft_config:`.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/ds_zero_3.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    (tmp_path / "configs/lora.yaml").write_text(
        "max_input_length: 512\n"
        "training_args:\n  output_dir: ./output\n  per_device_train_batch_size: 1\n  gradient_checkpointing: true\n"
        "  bf16: true\n  deepspeed: configs/ds_zero_3.json\n"
        "peft_config:\n  peft_type: LORA\n  r: 8\n  target_modules: [q_proj, v_proj]\n")
    r = run("torchrun --nproc_per_node 2 finetune.py data/ THUDM/glm-4-9b configs/lora.yaml")
    assert r.framework == "hf" and (r.setup.adapter, r.setup.zero_stage, r.setup.checkpointing) == ("lora", 3, "all")
    assert r.sources["adapter"] == "lora.yaml: peft_config.peft_type LORA"
    assert r.sources["checkpointing"] == "lora.yaml: training_args.gradient_checkpointing"
    # A PEFT section is not one of TRL's keys: the plain HF Trainer's defaults apply, not TRL's.
    assert "TRL" not in r.sources["input_grad_hook"]
    assert "lora.yaml: max_input_length" in r.unknown


def test_vision_tower_lora_under_reentrant_is_silent_before_transformers_5(tmp_path):
    """A VLM script that puts LoRA in the vision tower: before transformers 5 enable_input_require_grads hooks only
    the token embeddings, so the tower's reentrant-checkpointed blocks never learn (2U1/Qwen-VL-Series-Finetune
    issue 193); transformers 5 hooks the patch embedding too and defaults to non-reentrant."""
    script = tmp_path / "finetune_lora_vision.sh"
    script.write_text("BATCH=4\nDEVICES=8\nACC=$((128 / (BATCH * DEVICES)))\n"
                      "deepspeed src/train/train_sft.py --lora_enable True --vision_lora True --freeze_llm True "
                      "--gradient_checkpointing True --gradient_accumulation_steps $ACC "
                      "--image_min_pixels $((256 * 28 * 28)) --output_dir out\n")
    tokens = command_from_script(str(script))
    assert tokens[tokens.index("--gradient_accumulation_steps") + 1] == "4"
    assert tokens[tokens.index("--image_min_pixels") + 1] == str(256 * 28 * 28)
    old = _findings(f"bash {script}", with_versions("transformers=4.56.1", {}))
    # The script's own code decides reentrancy; before 5 the finding holds with the hook as well.
    assert old["reentrant-partial-silent"] == "the script checkpoints reentrant"
    new = _findings(f"bash {script}", with_versions("transformers=5.2.0", {}))
    # 2U1's train_sft.py always calls enable_input_require_grads (frontends/vlm_lineage.py), and from transformers 5
    # that hooks the patch embedding as well: nothing is left without gradients.
    assert "reentrant-partial-silent" not in new
    # Adapters named in the vision tower by the target list read the same way.
    r = run("python train.py --use_peft --lora_target_modules q_proj visual.blocks.0.attn.qkv --gradient_checkpointing")
    assert r.setup.tower_adapters and "lora_target_modules" in r.sources["tower_adapters"]


def test_the_path_of_trls_own_script_dates_the_release():
    """TRL's scripts moved (examples/scripts/sft_trainer.py until 0.7.1, examples/scripts/sft.py from 0.7.2,
    trl/scripts/sft.py from 0.13.0: the tags of huggingface/trl that hold each path), so the script a launch runs
    rules release ranges out, as flag spellings do."""
    def era(line: str) -> str | None:
        doc = json.loads(run_check(shlex.split(line), None, [], {}, as_json=True)[0])
        return doc["inferred_eras"].get("trl", {}).get("range")

    flags = "--model_name_or_path m --use_peft --lora_r 16 --output_dir o"
    assert era(f"python examples/scripts/sft_trainer.py {flags}") == ">=0.5.0,<0.7.2"
    assert era(f"accelerate launch trl/examples/scripts/sft_vlm.py {flags}") == ">=0.12.0"
    assert era(f"python -m trl.scripts.grpo {flags}") == ">=0.14.0"
    assert era(f"python my_sft.py {flags}") is None


def test_era_clues_are_intersected_and_contradictions_said():
    """Flag spellings narrow a release range to its shortest form; spellings no single release has (copied from
    two releases' docs) date nothing instead of an empty range."""
    from loraflow.frontends.scenarios import intersect

    assert intersect("<4.1.0,>=3.0.0,>=3.0.0,>=3.1.0") == ">=3.1.0,<4.1.0"
    assert intersect(">=0.5.0,<0.7.2,>=0.8.0") is None and intersect("==0.5.0,>=0.6") is None
    r = run("swift sft --model Qwen/Qwen2.5-7B --sft_type lora --train_type lora --dataset x", {})
    assert "ms-swift" not in r.eras
    assert any("mixes spellings no single release has" in n for n in r.notes)
    r = run("swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B --train_type lora --dataset x", {})
    assert r.eras["ms-swift"][0] == ">=3.1.0,<4.1.0"
