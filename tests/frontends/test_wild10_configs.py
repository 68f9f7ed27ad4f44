"""A tenth sweep, of users' configs and launch lines for the newer releases of LLaMA-Factory (0.9.2+), Axolotl
(0.8 - 0.13) and ms-swift (3.x - 4.x): the readings it found wrong. Each input is a short synthetic file or line of
the same shape; the comment names the public repository (and path) that showed the class."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends import from_command, from_files
from config_files import rule_ids as _ids, write as _write

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "trl": Version("0.29.0")}


# axolotl-ai-cloud/axolotl examples/gemma4/31b-qlora.yaml (`adapter: qlora`, `gradient_checkpointing: true`,
# `activation_offloading: true`): Axolotl turns the Trainer's gradient checkpointing off and wraps every decoder layer
# in torch's checkpoint_wrapper itself (loaders/model.py _apply_activation_checkpointing). check read it as no
# checkpointing at all for an adapter run.
def test_axolotl_activation_offloading_true_checkpoints_through_torchs_wrapper(tmp_path):
    body = ("base_model: meta-llama/Llama-3.1-8B\nadapter: {adapter}\nload_in_4bit: {q}\nlora_r: 16\n"
            "lora_target_linear: true\nsequence_len: 2048\nbf16: auto\ngradient_checkpointing: true\n"
            "activation_offloading: true\ndatasets:\n  - path: x\n    type: chat_template\n")
    for adapter, q in (("qlora", "true"), ("lora", "false")):
        r = from_files("axolotl", [_write(tmp_path, f"{adapter}.yaml", body.format(adapter=adapter, q=q))], CURRENT)
        s = r.setup
        assert (s.checkpointing, s.checkpoint_impl, s.reentrant) == ("all", "torch-wrapper", False), adapter
        assert "activation_offloading" in r.sources["checkpointing"]
    fsdp = body.format(adapter="lora", q="false") + "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
    r = from_files("axolotl", [_write(tmp_path, "fsdp.yaml", fsdp)], CURRENT)
    assert (r.setup.engine, r.setup.checkpoint_outside_shard) == ("fsdp2", False)
    # The other offloading modes keep the Trainer's checkpointing (legacy: its checkpoint function patched).
    legacy = body.format(adapter="lora", q="false").replace("activation_offloading: true", "activation_offloading: "
                                                            "legacy")
    s = from_files("axolotl", [_write(tmp_path, "legacy.yaml", legacy)], CURRENT).setup
    assert (s.checkpointing, s.checkpoint_impl, s.reentrant) == ("all", "transformers", True)


# hiyouga/LLaMA-Factory examples/train_qlora/llama3_lora_sft_otfq.yaml (24073f59: `quantization_method: bitsandbytes`)
# and its docs (llamafactory.readthedocs.io, QuantizationArguments: quantization_method
# Literal["bitsandbytes", "hqq", "eetq"], default bitsandbytes), and users' QLoRA YAMLs written from them
# (`quantization_bit: 4` + `quantization_method: bitsandbytes`): check knew only the later spelling `bnb`, so the
# base was read as unquantized and no 4-bit fact was checked.
def test_llama_factory_quantization_method_bitsandbytes_is_bitsandbytes(tmp_path):
    body = ("model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nstage: sft\ndo_train: true\n"
            "finetuning_type: lora\nlora_target: all\nquantization_bit: 4\nquantization_method: {m}\n"
            "template: llama3\nbf16: true\n")
    for method in ("bitsandbytes", "bnb"):
        r = from_files("llama-factory", [_write(tmp_path, f"{method}.yaml", body.format(m=method))], CURRENT)
        assert r.setup.quantization == "4bit", method
        assert r.setup.quant_storage_matches is True
        # the older spelling is noted: later releases refuse it
        assert any("later ones name it `bnb`" in n for n in r.notes) == (method == "bitsandbytes")
    r = from_files("llama-factory", [_write(tmp_path, "hqq.yaml", body.format(m="hqq"))], CURRENT)
    assert r.setup.quantization is None  # HQQ: not bitsandbytes


# hiyouga/LLaMA-Factory examples/train_lora/qwen2_5vl_lora_sft.yaml with `freeze_vision_tower: false` (and
# `freeze_multi_modal_projector: false`), as users post it to adapt the vision tower too: from v0.9.0
# patch_target_modules (model_utils/visual.py) names the tower's modules by full path and always leaves out the
# lora_conflict_keys (Qwen2-VL's Conv3d patch_embed), so the adapters land in the tower's Linear layers as asked.
# check called it a crash (lora-targets-vision-tower: PEFT refusing the Conv3d).
def test_llama_factory_unfrozen_vision_tower_gets_adapters_by_full_path(tmp_path):
    body = ("model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
            "lora_target: all\nfreeze_vision_tower: false\ntemplate: qwen2_vl\ncutoff_len: 2048\nbf16: true\n")
    path = _write(tmp_path, "vl.yaml", body)
    new = from_files("llama-factory", [path], {**CURRENT, "llama-factory": Version("0.9.3")})
    s = new.setup
    assert (s.targets_all_towers, s.tower_adapters, s.towers_trainable) == (False, True, True)
    assert "lora_conflict_keys" in new.sources["targets_all_towers"]
    assert "lora-targets-vision-tower" not in _ids(new)
    # Before v0.9.0 the short names went to PEFT as they were, and `proj` matched the Conv3d patch embedding.
    old = from_files("llama-factory", [path], {**CURRENT, "llama-factory": Version("0.8.3")})
    assert old.setup.targets_all_towers is True and "lora-targets-vision-tower" in _ids(old)


# modelscope/ms-swift examples/train/activation_cpu_offload/train.sh (`--activation_cpu_offload true` with an FSDP2
# accelerate config): the flag of ms-swift's ActivationCpuOffloadCallBack (swift/plugin/activation_cpu_offload.py)
# was listed as not understood, which alone made check exit 1.
def test_ms_swift_activation_cpu_offload_is_read(tmp_path):
    line = ["swift", "sft", "--model", "Qwen/Qwen3-0.6B", "--train_type", "lora", "--torch_dtype", "bfloat16",
            "--gradient_checkpointing", "false", "--fsdp", "fsdp2", "--activation_cpu_offload", "true"]
    r = from_command(line, CURRENT)
    assert not [u for u in r.unknown if "activation_cpu_offload" in u], r.unknown
    assert any("offloaded to CPU per FSDP unit" in n and "(swift/plugin/activation_cpu_offload.py; FSDP)" in n
               for n in r.notes), r.notes
    r = from_command(line[:-4] + ["--activation_cpu_offload", "true"], CURRENT)
    assert any("ms-swift raises ValueError" in n for n in r.notes), r.notes


# modelscope/ms-swift examples/train/multi-gpu/fsdp_qlora/train.sh: `accelerate launch --config_file
# fsdp_offload.json swift/cli/sft.py --train_type lora --quant_bits 4 ...`. The ms-swift reading never opened the
# accelerate config: one process, no engine, exit 0, for an FSDP1 run with CPU offload on two processes.
def test_ms_swift_under_accelerate_launch_reads_the_accelerate_config(tmp_path):
    cfg = _write(tmp_path, "fsdp_offload.json", '{"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", '
                 '"fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_offload_params": true, '
                 '"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_use_orig_params": false}, "mixed_precision": "no", '
                 '"num_machines": 1, "num_processes": 2, "use_cpu": false}')
    tail = ["swift/cli/sft.py", "--model", "Qwen/Qwen2.5-7B-Instruct", "--train_type", "lora", "--quant_bits", "4",
            "--bnb_4bit_quant_storage", "bfloat16", "--gradient_checkpointing", "true"]
    s = from_command(["accelerate", "launch", "--config_file", cfg, *tail], CURRENT).setup
    assert (s.engine, s.world_size, s.offload, s.fsdp_use_orig_params) == ("fsdp1", 2, True, False)
    # A config that is not here: each engine it could select is evaluated, not one process assumed.
    r = from_command(["accelerate", "launch", "--config_file", "conf/multi_node.json", *tail], CURRENT)
    assert r.forks and "accelerate_config" in r.forks, (r.setup.engine, r.forks)


# modelscope/ms-swift examples/megatron/lora/dense.sh and examples/megatron/multimodal/lora_llm_vit_full/sft.sh
# (`NPROC_PER_NODE=2 megatron sft --tuner_type lora --tensor_model_parallel_size 2 --recompute_granularity full ...`):
# Megatron-SWIFT's console script was not recognised, so the line was read as an HF Trainer script with `sft` and
# every Megatron flag not understood.
def test_megatron_swift_is_read_as_ms_swift_on_megatron_core():
    line = ["env", "NPROC_PER_NODE=2", "megatron", "sft", "--model", "Qwen/Qwen2.5-7B-Instruct", "--tuner_type",
            "lora", "--target_modules", "all-linear", "--tensor_model_parallel_size", "2", "--sequence_parallel",
            "true", "--recompute_granularity", "full", "--recompute_method", "uniform", "--micro_batch_size", "16",
            "--global_batch_size", "16", "--finetune", "true", "--no_save_optim", "true", "--max_length", "2048"]
    r = from_command(line, CURRENT)
    assert r.framework == "ms-swift" and not r.unknown, r.unknown
    assert (r.setup.stage, r.setup.adapter, r.setup.world_size) == ("sft", "lora", 2)
    assert r.sources["stage"] == "megatron sft"
    assert any("Megatron-Core" in n and "not evaluated" in n for n in r.notes), r.notes
    vit = from_command(["megatron", "sft", "--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--tuner_type", "lora_llm",
                        "--vit_lr", "1e-5", "--aligner_lr", "2e-5"], CURRENT)
    assert vit.setup.towers_trainable and "lora_llm" in vit.sources["towers_trainable"]


# axolotl-ai-cloud/axolotl examples/llama-3/fft-8b-liger-fsdp.yaml: the newer examples choose the attention backend
# with `attention: flash` (beside flash_attention / attn_implementation), which check listed as not understood.
def test_axolotl_attention_backend_key_is_known(tmp_path):
    path = _write(tmp_path, "fft.yaml", "base_model: NousResearch/Meta-Llama-3.1-8B\nsequence_len: 4096\nbf16: auto\n"
                  "gradient_checkpointing: true\nattention: flash\ndatasets:\n  - path: x\n    type: chat_template\n")
    r = from_files("axolotl", [path], CURRENT)
    assert not r.unknown, r.unknown


# hiyouga/LLaMA-Factory examples/train_full/qwen2_5vl_full_sft.yaml (`pad_to_multiple_of: 28`, a data option of the
# newer releases) was listed as not understood.
def test_llama_factory_pad_to_multiple_of_is_known(tmp_path):
    path = _write(tmp_path, "full.yaml", "model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nstage: sft\n"
                  "finetuning_type: full\ntemplate: llama3\ncutoff_len: 2048\npad_to_multiple_of: 28\nbf16: true\n")
    assert not from_files("llama-factory", [path], CURRENT).unknown


# ms-swift's examples/megatron/lora/dense.sh is a script whose launch line starts with `megatron`.
def test_a_megatron_swift_script_has_its_launch_line(tmp_path):
    from loraflow.frontends.argv import split_command
    from loraflow.frontends.shell import command_from_script

    script = tmp_path / "dense.sh"
    script.write_text("NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 \\\nmegatron sft --load Qwen2.5-7B-mcore "
                      "--train_type lora --lora_rank 8\n")
    assert split_command(command_from_script(str(script))).program == "megatron"
