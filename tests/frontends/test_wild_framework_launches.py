"""Framework launches as users write them in their own repositories (not the frameworks' examples): the readings a
sweep of public LLaMA-Factory, ms-swift, Axolotl, OpenRLHF, verl, torchtune, llama-recipes, alpaca-lora and LitGPT
launches found wrong. Each input is a short synthetic line of the same shape; the comment names the public
repository that showed the class."""

from __future__ import annotations

import shlex

from loraflow.frontends import from_command


def _check(line: str, versions: dict | None = None):
    return from_command(shlex.split(line), versions or {})


# Class: a framework config that is not here (a wrapper's `$1`, a path on the user's machine) is read as clean or
# refused; its keys are unseen, so it is listed as not read (exit 1).

# A two-node wrapper `accelerate launch ... -m axolotl.cli.train $1` (axolotl config passed to the script).
def test_axolotl_config_from_a_shell_argument_is_unseen_not_refused():
    result = _check("accelerate launch --num_processes 16 --num_machines 2 -m axolotl.cli.train $1")
    assert result.framework == "axolotl"
    assert any(u.startswith("$1") for u in result.unknown)


# wu-ming233/FIRST-impl: `tune run --nproc_per_node 4 first_lora_finetune_distributed.py --config
# ./configs/8B_lora.yaml`: a copy of a recipe under a longer name, and the user's own config file.
def test_torchtune_own_recipe_copy_and_own_config_are_read_as_unseen():
    result = _check("tune run --nproc_per_node 4 first_lora_finetune_distributed.py --config ./configs/8B_lora.yaml")
    assert result.framework == "torchtune" and result.setup.engine == "fsdp2" and result.setup.world_size == 4
    assert any("first_lora_finetune_distributed.py" in u for u in result.unknown)
    assert any("--config ./configs/8B_lora.yaml" in u for u in result.unknown)


def test_torchtune_builtin_config_name_stays_read_from_its_name():
    result = _check("tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device")
    assert result.setup.adapter == "lora" and not result.unknown


def test_litgpt_config_not_here_is_unseen():
    result = _check("litgpt finetune_lora --config $CFG")
    assert any("--config" in u for u in result.unknown)


def test_ms_swift_config_not_here_is_unseen_not_refused():
    result = _check("swift sft --config $1 --train_type lora")
    assert result.setup.adapter == "lora" and any("--config $1" in u for u in result.unknown)


def test_verl_own_config_name_not_here_is_unseen_but_verls_own_is_not():
    own = _check("python3 -m verl.trainer.main_ppo --config-path=$DIR --config-name=mycfg")
    assert any("--config-name mycfg" in u for u in own.unknown)
    shipped = _check("python3 -m verl.trainer.main_ppo --config-path=config --config-name=ppo_megatron_trainer")
    assert not any("--config-name" in u for u in shipped.unknown)
