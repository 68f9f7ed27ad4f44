"""torchtune frontend of `loraflow check`: `tune run` launches with torchtune's shipped configs (tests/fixtures/
frontends/torchtune/, MANIFEST.md), a launch posted in a mined thread, and built-in config names -> Combination, and
the rule findings `check` reports on them."""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import ROOT
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_command, from_files, guess_framework_for_files, run_check

FIX = ROOT / "tests" / "fixtures" / "frontends" / "torchtune"
CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2")}


def run(text: str, versions: dict = CURRENT):
    return from_command(shlex.split(text), versions)


def check(text: str, versions: dict = CURRENT) -> dict:
    return json.loads(run_check(shlex.split(text), None, [], dict(versions), True)[0])


def holds(doc: dict) -> dict[str, str | None]:
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


MINED_1072 = "tune run --nnodes=1 --nproc_per_node=2 lora_finetune_fsdp2 --config 7B_qlora_fsdp2.yaml"


def test_mined_qlora_fsdp2_launch_reads_its_config_file(monkeypatch):
    monkeypatch.chdir(FIX)  # the launch names its config relative to where it ran
    assert detect(shlex.split(MINED_1072)) == "torchtune"
    r = run(MINED_1072)
    s = r.setup
    assert (s.stage, s.adapter, s.quantization, s.engine, s.world_size) == ("sft", "lora", "4bit", "fsdp2", 2)
    assert (s.checkpointing, s.checkpoint_impl, s.reentrant, s.checkpoint_outside_shard) == (
        "all", "torch-wrapper", False, False)
    # torchao's NF4Tensor is sharded as a tensor subclass: there is no bitsandbytes storage dtype to mismatch.
    assert s.precision == "bf16" and s.quant_storage_matches and "NF4Tensor" in r.sources["quant_storage_matches"]
    assert r.eras["torchtune"][0] == ">=0.2.0,<0.3.0" and r.unknown == []
    assert check(MINED_1072)["findings"] == []


def test_builtin_config_is_read_from_its_name():
    r = run("tune run lora_finetune_single_device --config llama3_1/8B_qlora_single_device")
    s = r.setup
    assert (s.adapter, s.quantization, s.engine, s.world_size, s.precision) == ("lora", "4bit", "single", 1, "bf16")
    assert "read from its name" in r.sources["quantization"] and "checkpointing" in r.unsure
    dora = run("tune run --nproc_per_node 2 lora_finetune_distributed --config llama3/8B_qdora_single_device")
    assert (dora.setup.adapter, dora.setup.quantization, dora.setup.world_size) == ("dora", "4bit", 2)


def test_dora_and_full_finetune_train_in_pure_bf16():
    dora = f"tune run --nproc_per_node 2 lora_finetune_distributed --config {FIX / '8B_dora.yaml'}"
    r = run(dora)
    assert (r.setup.adapter, r.setup.engine, r.setup.world_size, r.setup.checkpointing) == ("dora", "fsdp2", 2, "off")
    assert holds(check(dora)) == {"bf16-lost-updates": None}
    full = f"tune run --nproc_per_node 4 full_finetune_distributed --config {FIX / '8B_full.yaml'}"
    assert run(full).setup.adapter == "full" and holds(check(full)) == {"bf16-lost-updates": None}
    assert holds(check(full + " dtype=fp32")) == {}


def test_lora_dpo_runs_one_concatenated_forward():
    r = run(f"tune run --nproc_per_node 2 lora_dpo_distributed --config {FIX / '8B_lora_dpo.yaml'} "
            "enable_activation_offloading=True")
    assert (r.setup.stage, r.setup.forwards_per_step, r.setup.checkpointing) == ("dpo", 1, "all")
    assert any("offloaded to CPU" in n for n in r.notes)


def test_releases_before_0_3_wrap_with_fsdp1_and_adapters_in_their_own_units():
    text = f"tune run --nproc_per_node 2 lora_finetune_distributed --config {FIX / '8B_qlora_single_device.yaml'}"
    old = run(text, {**CURRENT, "torchtune": Version("0.2.1")})
    s = old.setup
    assert (s.engine, s.fsdp_use_orig_params, s.fsdp_frozen_units_separate) == ("fsdp1", False, True)
    assert run(text).setup.engine == "fsdp2"
    # check evaluates both sides of the change; neither holds a rule for this launch.
    assert holds(check(text)) == {}


def test_yaml_alone_takes_its_launch_from_the_header_line():
    assert guess_framework_for_files([str(FIX / "405B_qlora.yaml")]) == "torchtune"  # `loraflow check FILE`
    r = from_files("torchtune", [str(FIX / "405B_qlora.yaml")], CURRENT)
    assert (r.setup.engine, r.setup.world_size, r.setup.quantization) == ("fsdp2", 8, "4bit")
    assert any("header comment" in n for n in r.notes)


def test_unread_overrides_are_listed_and_deletions_read():
    r = run(f"tune run lora_finetune_single_device --config {FIX / '8B_qlora_single_device.yaml'} "
            "enable_activation_checkpoint=True ~enable_activation_checkpointing --verbose")
    assert set(r.unknown) == {"enable_activation_checkpoint=True", "--verbose (not a `key=value` override)"}
    assert r.setup.checkpointing == "off"  # the key was deleted: the recipe's cfg.get(..., False)


@pytest.mark.parametrize("text, match", [
    ("tune run lora_finetune_single_device --config {fix}/8B_qlora_single_device.yaml dtype=fp16", "dtype"),
    ("tune run lora_finetune_single_device --config {fix}/8B_qlora_single_device.yaml dtype=int8", "dtype"),
    ("tune run generate --config generation", "does not train"),
    ("tune ls", "does not train"),
    ("tune run lora_finetune_single_device", "--config"),
    ("tune run my_own_recipe --config x.yaml", "not a torchtune training recipe"),
])
def test_bad_input_names_the_key(text, match):
    with pytest.raises(LoraflowError, match=match):
        run(text.format(fix=FIX))


# torchtune's README before `tune run` (v0.1) and users with a cloned repo launch a recipe as a script:
# `torchrun --nnodes 1 --nproc_per_node 4 recipes/lora_finetune_distributed.py --config ...` (pytorch/torchtune
# issues posting such lines). Each recipe parses `--config` and `key=value` itself (config/_parse.py), so the line
# reads as `tune run` does, not as an HF Trainer script.
def test_recipe_launched_as_a_script_reads_as_tune_run():
    line = ("torchrun --nnodes 1 --nproc_per_node 2 recipes/lora_finetune_distributed.py "
            "--config llama3/8B_qlora_single_device enable_activation_checkpointing=True")
    assert detect(shlex.split(line)) == "torchtune"
    setup = run(line).setup
    tune = run("tune run --nproc_per_node 2 lora_finetune_distributed --config llama3/8B_qlora_single_device "
               "enable_activation_checkpointing=True").setup
    assert setup == tune and setup.world_size == 2 and setup.quantization == "4bit"
    assert "torchtune's lora_finetune_distributed recipe" in run(line).sources["stage"]
    assert detect(shlex.split("python third_party/torchtune/recipes/dev/grpo_full_finetune_distributed.py "
                              "--config c.yaml")) == "torchtune"
    # A script of the same name outside a recipes/ folder, or without --config, is someone else's.
    plain = "torchrun --nproc_per_node 2 lora_finetune_distributed.py --config c.yaml"
    assert detect(shlex.split(plain)) != "torchtune"
    assert detect(shlex.split("torchrun --nproc_per_node 2 recipes/lora_finetune_distributed.py "
                              "--output_dir o --learning_rate 1")) != "torchtune"
