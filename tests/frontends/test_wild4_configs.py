"""A fourth sweep, of users' own framework config files (DeepSpeed JSONs, accelerate configs, torchtune, Axolotl,
LLaMA-Factory and TRL YAMLs from public repositories): the readings it found wrong. Each input is a short synthetic
file of the same shape; the comment names the public repository that showed the class."""

from __future__ import annotations

import json

from packaging.version import Version

from loraflow.frontends import from_files, guess_framework_for_files
from config_files import rule_ids as _ids, write as _write

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "trl": Version("0.29.0")}


# akai100/Qwen3-VL-GeoLoRA ds_config_zero3.json: its ZeRO section is spelled `zero-optimization`. Without a
# zero_optimization key the file was not recognised as DeepSpeed's at all (read as a loraflow config, 13 errors, exit
# 2); DeepSpeed itself ignores the misspelled section (ZeRO off) and accelerate refuses the file.
def test_a_deepspeed_json_without_zero_optimization_is_still_deepspeeds(tmp_path):
    path = _write(tmp_path, "ds.json", json.dumps({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10,
        "bf16": {"enabled": True}, "zero-optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    assert guess_framework_for_files([path]) == "deepspeed"
    r = from_files("deepspeed", [path], CURRENT)
    assert (r.setup.engine, r.setup.zero_stage, r.setup.offload) == ("deepspeed", 0, False)
    assert any("`zero-optimization` is not a key DeepSpeed reads" in n for n in r.notes), r.notes
    assert f"{path}: zero-optimization" in r.unknown
    # An HF TrainingArguments YAML is no DeepSpeed config, whatever batch keys it shares.
    hf = _write(tmp_path, "args.yaml", "output_dir: out\ngradient_accumulation_steps: 4\nper_device_train_batch_size: 2"
                                       "\nlearning_rate: 1e-4\nbf16: true\n")
    assert guess_framework_for_files([hf]) != "deepspeed"


# liangwq/Chatglm_lora_multi-gpu ds_config_zero3.json (`train_batch_size: 4`, micro batch 1, accumulation 2) and the
# same file: DeepSpeed asserts train_batch_size == micro x accumulation x world size, so the file fixes the number of
# processes (2), where check assumed 1.
def test_a_deepspeed_json_with_the_three_batch_sizes_fixes_the_world_size(tmp_path):
    path = _write(tmp_path, "ds.json", json.dumps({
        "zero_optimization": {"stage": 2}, "fp16": {"enabled": True}, "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}))
    r = from_files("deepspeed", [path], CURRENT)
    assert r.setup.world_size == 4 and "train_batch_size 32" in r.sources["world_size"]
    auto = _write(tmp_path, "auto.json", json.dumps({
        "zero_optimization": {"stage": 2}, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4}))
    assert from_files("deepspeed", [auto], CURRENT).setup.world_size == 1  # "auto": the launcher's count, unseen


# xuqi220/QLaw ds_zero2_no_offload.json: `"offload_optimizer": {"device": "auto"}` (and offload_param). "auto" is no
# DeepSpeed device; accelerate's DeepSpeedPlugin fills it from offload_*_device (default none), so the HF Trainer
# runs it without offload. It was read as CPU offload.
def test_an_auto_offload_device_is_accelerates_default_none(tmp_path):
    path = _write(tmp_path, "ds.json", json.dumps({
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"}, "offload_param": {"device": "auto"}},
        "fp16": {"enabled": True}}))
    r = from_files("deepspeed", [path], CURRENT)
    assert r.setup.offload is False
    assert any("offload_optimizer.device is \"auto\"" in n for n in r.notes), r.notes
    cpu = _write(tmp_path, "cpu.json", json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "cpu"}}}))
    assert from_files("deepspeed", [cpu], CURRENT).setup.offload is True


# ShuFD/lora configs/grpo.yaml: a flat YAML of the user's own GRPO script (`model_name`, `train_file`, `use_4bit:
# true`, `lora_r: 16`, no use_peft). Read as TRL by its name, TRL's use_peft default made it full fine-tuning of a
# 4-bit base: an unconditional kbit-full-finetune crash. The 4-bit switch is the script's own, so its LoRA flags are.
def test_a_scripts_own_kbit_switch_makes_its_lora_flags_its_own(tmp_path):
    path = _write(tmp_path, "grpo.yaml", "model_name: ckpt/base\ntrain_file: data.jsonl\noutput_dir: out\n"
                                         "num_generations: 4\nlearning_rate: 2.0e-6\nuse_4bit: true\nlora_r: 16\n"
                                         "lora_alpha: 32\n")
    r = from_files("hf", [path], CURRENT)
    assert (r.setup.adapter, r.setup.quantization) == ("lora", "4bit")
    assert "kbit-full-finetune" not in _ids(r)
    # TRL's own 4-bit key keeps TRL's default: without use_peft, TRL trains every weight of the quantized base.
    trl = _write(tmp_path, "grpo_trl.yaml", "model_name_or_path: m\noutput_dir: out\nnum_generations: 4\n"
                                            "load_in_4bit: true\nlora_r: 16\n")
    assert from_files("hf", [trl], CURRENT).setup.adapter == "full"


# farshadghodsian/torchtune-amd-recipes llama3.2-vision-11b-qlora-finetune.yaml: `model_dir: /tmp/...` at the top,
# used as `${model_dir}` in the checkpointer and tokenizer paths. It is the file's own OmegaConf variable, not a
# setting: listing it as not understood turned a clean reading into "it depends" (exit 1).
def test_a_torchtune_interpolation_variable_is_not_an_unread_setting(tmp_path):
    path = _write(tmp_path, "qlora.yaml", "# tune run --nproc_per_node 2 lora_finetune_distributed --config x\n"
                                          "model_dir: /tmp/Llama-3.2-1B\nunused_knob: 3\n"
                                          "output_dir: /tmp/out\nmodel:\n"
                                          "  _component_: torchtune.models.llama3_2.qlora_llama3_2_1b\n"
                                          "  lora_attn_modules: [q_proj, v_proj]\n  lora_rank: 8\n"
                                          "checkpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\n"
                                          "  checkpoint_dir: ${model_dir}\n  output_dir: ${output_dir}\n"
                                          "dtype: bf16\nenable_activation_checkpointing: true\n")
    r = from_files("torchtune", [path], CURRENT)
    assert r.unknown == ["qlora.yaml: unused_knob"], r.unknown


# Com1t/hf-slurm-training ds_zero3.json (gather "auto"): a DeepSpeed JSON alone does not say whether an adapter or
# the whole model trains, so an adapter-only finding is a question about the launch, not a certain finding.
def test_a_deepspeed_json_alone_leaves_what_trains_a_question(tmp_path):
    from loraflow.frontends import run_check

    path = _write(tmp_path, "ds_zero3.json", json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                                                          "train_micro_batch_size_per_gpu": "auto"}))
    doc = json.loads(run_check(None, "deepspeed", [path], dict(CURRENT), as_json=True)[0])
    assert doc["exit_code"] == 1
    empty = [f for f in doc["findings"] if f["rule"] == "zero3-empty-adapter-save"]
    assert empty and empty[0]["holds_if"] is not None and "adapter" in json.dumps(doc["depends_on"])


# Jacobson-CompSysBio/mentor-rl: an accelerate config with distributed_type MEGATRON_LM. Megatron's sharding is not
# modelled, so the run is not called clean: it is named as what check could not read (exit 1).
def test_an_accelerate_megatron_config_is_named_not_modelled(tmp_path):
    from loraflow.frontends import run_check

    path = _write(tmp_path, "meg.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\n"
                                        "num_processes: 4\nmixed_precision: bf16\n")
    doc = json.loads(run_check(["accelerate", "launch", "--config_file", path, "train.py", "--lora_r", "8"], None,
                               [], dict(CURRENT), as_json=True)[0])
    assert doc["exit_code"] >= 1 and any("Megatron-LM" in u for u in doc["unknown"])


# Found in review: an interpolation inside a list names a variable too; batch sizes no process count can satisfy.
def test_list_interpolations_and_an_unsatisfiable_deepspeed_batch(tmp_path):
    path = _write(tmp_path, "tt.yaml", "base_name: model\nmodel:\n  _component_: torchtune.models.llama3_2."
                                       "lora_llama3_2_1b\n  lora_attn_modules: [q_proj, v_proj]\ncheckpointer:\n"
                                       "  checkpoint_files: ['${base_name}.safetensors']\n")
    assert not any("base_name" in u for u in from_files("torchtune", [path], CURRENT).unknown)
    path = _write(tmp_path, "ds.json", json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                                                   "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}))
    assert any("_batch_assertion" in u for u in from_files("deepspeed", [path], CURRENT).stops)
