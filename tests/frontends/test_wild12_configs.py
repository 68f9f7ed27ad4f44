"""A twelfth sweep, of users' accelerate config files and DeepSpeed JSONs (alone and beside the launch lines that use
them): the readings it found wrong. Each input is a short synthetic file of the same shape; the comment names the
public repository (and path or thread) that showed the class."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends import from_command, from_files
from config_files import write as _write

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "trl": Version("0.29.0"), "accelerate": Version("1.15.0")}


# huggingface/accelerate examples/config_yaml_templates/fp8.yaml (`mixed_precision: "fp8"` with an fp8_config):
# accelerate runs fp8 layers inside a bf16 autocast and hands DeepSpeed/FSDP bf16; check read the file as fp32.
def test_fp8_mixed_precision_reads_as_bf16_autocast(tmp_path):
    single = _write(tmp_path, "fp8.yaml", 'distributed_type: "NO"\nmixed_precision: "fp8"\nfp8_config:\n'
                    "  backend: TE\n  fp8_format: E4M3\n")
    r = from_files("accelerate", [single], CURRENT)
    assert r.setup.precision == "bf16-mixed"
    assert any("fp8" in n and "bf16" in n for n in r.notes)
    zero3 = _write(tmp_path, "z3.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
                   "mixed_precision: fp8\nnum_processes: 2\n")
    assert from_files("accelerate", [zero3], CURRENT).setup.precision == "bf16-mixed"
    # beside a launch line whose script sets no --bf16: the Trainer takes accelerate's mixed precision
    line = ["accelerate", "launch", "--config_file", zero3, "trl/scripts/sft.py", "--model_name_or_path", "m",
            "--use_peft", "--bf16", "false"]
    assert from_command(line, CURRENT).setup.precision == "bf16-mixed"


# huggingface/accelerate pull 2460 (a config with top-level `dynamo_backend: INDUCTOR`) and older configs with
# `fp16: true`: accelerate converts both spellings (commands/config/config_args.py process_config); check listed them
# as keys it did not understand and read no mixed precision from `fp16: true`.
def test_older_top_level_spellings_are_converted_as_accelerate_does(tmp_path):
    path = _write(tmp_path, "old.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                  "dynamo_backend: INDUCTOR\nfp16: true\nnum_processes: 2\n")
    r = from_files("accelerate", [path], CURRENT)
    assert not [u for u in r.unknown if "dynamo_backend" in u or ": fp16" in u]
    assert r.setup.precision == "fp16-mixed"


# a mistyped top-level key (seen in accelerate issue threads as `mixed_precison`): accelerate launch stops with
# "had unknown keys"; check only listed the key as not understood.
def test_unknown_top_level_key_says_accelerate_refuses_the_file(tmp_path):
    path = _write(tmp_path, "typo.yaml", "distributed_type: MULTI_GPU\nmixed_precison: bf16\nnum_processes: 2\n")
    r = from_files("accelerate", [path], CURRENT)
    assert f"{path}: mixed_precison" in r.unknown
    assert any("mixed_precison" in n and "refuses" in n for n in r.notes)


# deepspeedai/DeepSpeed issue 1543 (an NVMe config with an `aio` block inside zero_optimization; issue 2721 shows the
# same file stopping with "validation error for DeepSpeedZeroConfig aio extra fields not permitted"): the ZeRO section
# forbids keys it lacks since DeepSpeed 0.7.0, so the file is refused; check listed the key as merely not understood.
def test_unknown_zero_optimization_key_is_a_refusal_since_deepspeed_0_7(tmp_path):
    path = _write(tmp_path, "nvme.json", '{"train_batch_size": 16, "fp16": {"enabled": true}, "zero_optimization": '
                  '{"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}, "aio": {"block_size": '
                  '1048576}}}')
    stops = from_files("deepspeed", [path], CURRENT).stops
    assert any("zero_optimization.aio" in u and "refuses" in u and "top-level" in u for u in stops)
    old = from_files("deepspeed", [path], {**CURRENT, "deepspeed": Version("0.5.10")}).unknown
    assert any("zero_optimization.aio" in u and "refuses" not in u for u in old)


# huggingface/accelerate pull 941 (an accelerate config naming deepspeed_config_file and also zero_stage, offload
# devices and mixed_precision; yuvalkirstain/PickScore issue 2 shows the error): accelerate >= 0.16.0 stops when the
# DeepSpeed plugin is built, because the JSON owns those settings. check read the run as valid.
def test_settings_beside_deepspeed_config_file_are_refused(tmp_path):
    _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    body = "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: {ds}\n{extra}"
    clash = _write(tmp_path, "clash.yaml", body.format(ds=tmp_path / "ds.json", extra="  zero_stage: 3\n"
                                                       "  zero3_init_flag: true\nmixed_precision: bf16\n"))
    stops = from_files("accelerate", [clash], CURRENT).stops
    refusal = [u for u in stops if "will be ignored" in u]
    assert refusal and "zero_stage" in refusal[0] and "mixed_precision" in refusal[0]
    assert "zero3_init_flag" not in refusal[0]  # the JSON does not own it: accelerate lets it through
    clean = _write(tmp_path, "clean.yaml", body.format(ds=tmp_path / "ds.json", extra="  zero3_init_flag: true\n"))
    assert not [u for u in from_files("accelerate", [clean], CURRENT).stops if "will be ignored" in u]
    before = from_files("accelerate", [clash], {**CURRENT, "accelerate": Version("0.15.0")}).stops
    assert not [u for u in before if "will be ignored" in u]
    # mixed precision given as a launch flag is not the config file's: allowed beside the JSON
    line = ["accelerate", "launch", "--config_file", clean, "--mixed_precision", "bf16", "train.py", "--output_dir",
            "o", "--model_name_or_path", "m", "--bf16"]
    assert not [u for u in from_command(line, CURRENT).stops if "will be ignored" in u]


# an accelerate FSDP config with fsdp_activation_checkpointing: true given alone (an OLMo fine-tuning guide's
# accelerate_fsdp_config.yaml; trl docs' context-parallel config): accelerate checkpoints through torch's
# checkpoint_wrapper, which leaves the KV cache to the script. check read use_cache as on and gave a definite finding.
def test_config_alone_with_fsdp_activation_checkpointing_asks_about_use_cache(tmp_path):
    path = _write(tmp_path, "ac.yaml", "distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\nfsdp_config:\n"
                  "  fsdp_activation_checkpointing: true\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                  "  fsdp_use_orig_params: true\n")
    r = from_files("accelerate", [path], CURRENT)
    assert "use_cache" in r.unsure


# the same config beside a TRL launch with --gradient_checkpointing (huggingface/peft issue 2111 shows the Trainer's
# warning for the pair): the Trainer raises ValueError before the first step; check only noted it and exited 0.
def test_trainer_gradient_checkpointing_beside_fsdp_activation_checkpointing_is_refused(tmp_path):
    path = _write(tmp_path, "ac.yaml", "distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\nfsdp_config:\n"
                  "  fsdp_activation_checkpointing: true\n  fsdp_version: 2\n")
    line = ["accelerate", "launch", "--config_file", path, "trl/scripts/sft.py", "--model_name_or_path", "m",
            "--use_peft", "--gradient_checkpointing"]
    assert any("can't be set to True simultaneously" in u for u in from_command(line, CURRENT).stops)
    off = [a for a in line if a != "--gradient_checkpointing"] + ["--gradient_checkpointing", "false"]
    assert not [u for u in from_command(off, CURRENT).stops if "simultaneously" in u]


# huggingface/accelerate examples/deepspeed_config_templates/zero_stage3_offload_config.json (`"fp16": {"enabled":
# true}`) under a Trainer run with --bf16, and hiyouga/LlamaFactory issue 3224 ("ds bf16.enabled=True vs hf
# bf16|bf16_full_eval=False"): transformers refuses an explicit enabled value that differs from the Trainer's flag.
# check read the JSON's dtype and went on.
def test_explicit_dtype_in_deepspeed_json_must_match_the_trainer(tmp_path):
    ds = _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}, "fp16": {"enabled": true}, '
                '"bf16": {"enabled": false}}')
    line = ["deepspeed", "--num_gpus", "2", "train.py", "--model_name_or_path", "m", "--output_dir", "o",
            "--deepspeed", ds]
    refused = [u for u in from_command(line + ["--bf16"], CURRENT).stops if "transformers refuses" in u]
    assert len(refused) == 2 and {u.split(": ")[1].split(" ")[0] for u in refused} == {"fp16.enabled", "bf16.enabled"}
    assert not [u for u in from_command(line + ["--fp16"], CURRENT).stops if "transformers refuses" in u]
    auto = _write(tmp_path, "auto.json", '{"zero_optimization": {"stage": 3}, "fp16": {"enabled": "auto"}}')
    assert not [u for u in from_command(line[:-1] + [auto, "--bf16"], CURRENT).stops if "refuses" in u]


# OpenRLHF/OpenRLHF issue 63 and deepspeedai/DeepSpeed issue 3827 (ZeRO++ keys zero_hpz_partition_size,
# zero_quantized_weights, zero_quantized_gradients on DeepSpeed 0.9.5: "extra fields not permitted"): a release older
# than the key refuses the file; check knew the keys from newer releases and said nothing.
def test_zero_plus_plus_keys_are_refused_before_deepspeed_0_10(tmp_path):
    path = _write(tmp_path, "zpp.json", '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3, '
                  '"zero_hpz_partition_size": 8, "zero_quantized_weights": true}}')
    old = from_files("deepspeed", [path], {**CURRENT, "deepspeed": Version("0.9.5")}).stops
    assert len([u for u in old if "refuses" in u]) == 2
    assert not [u for u in from_files("deepspeed", [path], CURRENT).unknown if "zero_hpz" in u]


# TRL's examples/accelerate_configs/deepspeed_zero3.yaml (zero_stage, offload devices) with the script's own
# `--deepspeed ds.json`: the Trainer hands the JSON to the same plugin, which refuses the pair (accelerate >= 0.16).
def test_accelerate_deepspeed_fields_beside_the_scripts_own_json_are_refused(tmp_path):
    ds = _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    acc = _write(tmp_path, "zero3.yaml", "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                 "  zero_stage: 3\n  offload_param_device: none\n")
    line = ["accelerate", "launch", "--config_file", acc, "trl/scripts/sft.py", "--model_name_or_path", "m",
            "--use_peft", "--deepspeed", ds, "--output_dir", "o"]
    assert [u for u in from_command(line, CURRENT).stops if "will be ignored" in u and "zero_stage" in u]
    alone = line[:line.index("--deepspeed")] + ["--output_dir", "o"]
    assert not [u for u in from_command(alone, CURRENT).stops if "will be ignored" in u]


# Found in review: MiCS (mics_shard_size, from 0.9.2) and LoCo-ZeRO++ (zeropp_loco_param) are DeepSpeedZeroConfig
# fields until DeepSpeed removed them after 0.19.5 (0.19.8 refuses them by name).
def test_keys_of_features_deepspeed_had_for_a_while(tmp_path):
    from loraflow.frontends import parse_versions

    path = _write(tmp_path, "mics.json", '{"zero_optimization": {"stage": 3, "mics_shard_size": 8}}')
    then = from_files("deepspeed", [path], {**CURRENT, **parse_versions("deepspeed=0.15.3")}).unknown
    assert not [u for u in then if "mics_shard_size" in u]
    now = [u for u in from_files("deepspeed", [path], CURRENT).stops if "mics_shard_size" in u]
    assert now and "removed the feature" in now[0]
    # Without the run's release, a release before the removal may be it: not a stop, a question.
    unsure = from_files("deepspeed", [path], {k: v for k, v in CURRENT.items() if k != "deepspeed"})
    assert not [u for u in unsure.stops if "mics_shard_size" in u]
