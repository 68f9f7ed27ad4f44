"""An accelerate config file given alone to `loraflow check` (tests/fixtures/frontends/accelerate/, MANIFEST.md):
read by the same code that reads it beside a launch line, its engine facts deciding the rules, and what only the
training script decides evaluated both ways (findings then say under which choice they hold)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import from_files, guess_framework_for_files, run_check

FIX = ROOT / "tests" / "fixtures" / "frontends" / "accelerate"
CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}


def check(*paths, versions: dict = CURRENT) -> dict:
    return json.loads(run_check(None, "accelerate", [str(p) for p in paths], dict(versions), True)[0])


def holds(doc: dict) -> dict[str, str | None]:
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def variant(tmp_path, name: str, old: str, new: str):
    path = tmp_path / name
    path.write_text((FIX / name).read_text().replace(old, new))
    return path


def test_config_alone_is_recognised_and_read(capsys):
    from loraflow.commands.cli import main

    for name in ("fsdp.yaml", "deepspeed.yaml", "multi_gpu.yaml", "fsdp_offload_accelerate-2022.yaml"):
        assert guess_framework_for_files([str(FIX / name)]) == "accelerate", name
    code = main(["check", "--json", str(FIX / "fsdp.yaml")])
    doc = json.loads(capsys.readouterr().out)
    assert doc["framework"] == "accelerate" and code == 1  # conditional findings only


def test_fsdp_template_engine_facts_and_what_the_script_decides():
    r = from_files("accelerate", [str(FIX / "fsdp.yaml")], CURRENT)
    s = r.setup
    assert (s.engine, s.world_size, s.precision, s.fsdp_use_orig_params, s.stage) == ("fsdp1", 2, "bf16-mixed",
                                                                                      True, "sft")
    assert r.sources["stage"].startswith("assumed") and r.unknown == []
    assert {"adapter", "checkpointing", "reentrant", "quantization", "precision", "mixed_param_dtypes"} <= set(
        r.unsure)
    found = holds(check(FIX / "fsdp.yaml"))
    # use_orig_params true: the frozen base costs gradient memory only if the script trains an adapter.
    assert "LoRA adapter" in found["fsdp-frozen-grad-memory"]
    assert "float32 adapters beside a bf16/fp16 base" in found["fsdp1-mixed-dtype"]
    assert "fsdp1-mixed-requires-grad" not in found and all(found.values())


def test_use_orig_params_off_with_frozen_weights(tmp_path):
    path = variant(tmp_path, "fsdp.yaml", "fsdp_use_orig_params: true", "fsdp_use_orig_params: false")
    found = holds(check(path))
    assert "LoRA adapter" in found["fsdp1-mixed-requires-grad"]


def test_fp16_with_fsdp_crashes_if_the_script_loads_fp16_weights(tmp_path):
    path = variant(tmp_path, "fsdp.yaml", "mixed_precision: 'bf16'", "mixed_precision: 'fp16'")
    found = holds(check(path))
    assert "loads the model in fp16" in found["fp16-trainable-unscale"]


def test_mined_qlora_fsdp_offload_config_finds_the_storage_dtype_rule():
    r = from_files("accelerate", [str(FIX / "fsdp_offload_accelerate-2022.yaml")], CURRENT)
    assert (r.setup.engine, r.setup.offload, r.setup.precision, r.setup.world_size) == ("fsdp1", True, "fp32", 2)
    assert r.unknown == []
    found = holds(check(FIX / "fsdp_offload_accelerate-2022.yaml"))
    assert "4-bit" in found["qlora-storage-dtype"] and "packed uint8" in found["qlora-storage-dtype"]


def test_deepspeed_config_named_inside_or_given_beside():
    r = from_files("accelerate", [str(FIX / "deepspeed.yaml")], CURRENT)
    assert (r.setup.engine, r.setup.zero_stage, r.setup.world_size) == ("deepspeed", 1, 2)
    assert "inferred from its name" in r.sources["zero_stage"]
    ds = ROOT / "tests" / "fixtures" / "frontends" / "hf" / "ds_zero3.json"
    doc = check(FIX / "deepspeed.yaml", ds, versions={**CURRENT, "deepspeed": Version("0.15.3")})
    assert doc["setup"]["zero_stage"] == 3
    assert "non-reentrant" in holds(doc)["zero3-frozen-recompute"]


def test_unread_keys_are_listed(tmp_path):
    path = variant(tmp_path, "fsdp.yaml", "num_processes: 2", "num_processes: 2\nmixed_precison: fp16")
    path.write_text(path.read_text().replace("fsdp_offload_params: false", "fsdp_ofload_params: true"))
    r = from_files("accelerate", [str(path)], CURRENT)
    assert r.unknown == [f"{path}: mixed_precison", f"{path}: fsdp_config.fsdp_ofload_params"]


@pytest.mark.parametrize("old, new, match", [
    ("fsdp_use_orig_params: true", "fsdp_use_orig_params: true\n  fsdp_version: 3", "fsdp_version"),
    ("num_processes: 2", "num_processes: two", "num_processes"),
    ("distributed_type: FSDP", "backend: FSDP", "not an accelerate config"),
])
def test_bad_input_names_the_key(tmp_path, old, new, match):
    with pytest.raises(LoraflowError, match=match):
        from_files("accelerate", [str(variant(tmp_path, "fsdp.yaml", old, new))], CURRENT)
