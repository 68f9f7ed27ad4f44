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
    # in the script itself `$1` expands to nothing (the script run without arguments): still not refused
    empty = _check("accelerate launch --num_processes 16 --num_machines 2 -m axolotl.cli.train")
    assert empty.framework == "axolotl" and any("wrapper's argument" in u for u in empty.unknown)
    # a uv wrapper's `accelerate launch -m axolotl.cli.train "$CONFIG_FILE" "$@"`
    wrapped = _check('accelerate launch -m axolotl.cli.train "$CONFIG_FILE" "$@"')
    assert any(u.startswith("$CONFIG_FILE") for u in wrapped.unknown)


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


# Class: keys the framework has at the launch's release listed as not understood.

# flashlin/Samples torch-qa/LLaMA-Factory: `python src/train_bash.py ... --resume_lora_training True`, a key of the
# llmtuner era (src/llmtuner/hparams/finetuning_args.py), which also dates the launch before v0.8.0.
def test_llama_factory_llmtuner_era_keys_are_understood_and_date_the_release():
    result = _check("python src/train_bash.py --stage sft --do_train --model_name_or_path m --dataset d "
                    "--finetuning_type lora --lora_target q_proj,v_proj --resume_lora_training True "
                    "--num_layer_trainable 2 --dpo_beta 0.1 --output_dir o")
    assert result.framework == "llama-factory" and not result.unknown
    assert any("resume_lora_training exists in LLaMA-Factory <0.7.1" in n for n in result.notes)
    # checkpoint_dir loads adapters: it stays unread
    kept = _check("python src/train_bash.py --stage sft --model_name_or_path m --finetuning_type lora "
                  "--checkpoint_dir ckpt --output_dir o")
    assert any("checkpoint_dir" in u for u in kept.unknown)
    # sft_packing: the llmtuner-era name of packing (src/llmtuner/hparams/data_args.py)
    packed = _check("python src/train_bash.py --stage sft --model_name_or_path m --finetuning_type lora "
                    "--sft_packing True --output_dir o")
    assert packed.setup.packing is True and not packed.unknown


# A DPO launch copied from ms-swift 2.x's examples/pytorch/llm/scripts/dpo: `swift dpo ... --max_prompt_length 512`
# (RLHFArguments in swift/llm/utils/argument.py of 2.x).
def test_ms_swift_2x_rlhf_arguments_are_understood():
    result = _check("swift dpo --model_type yi-6b-chat --ref_model_type yi-6b-chat --sft_type lora "
                    "--max_prompt_length 512 --sft_beta 0.1 --dataset d")
    assert result.setup.stage == "dpo" and not result.unknown


# Class: a user's copy of a framework's training script under another name is read as another framework or refused.

# UNITES-Lab/MoE-RBench: `torchrun --nproc_per_node 2 finetuning_llama.py --enable_fsdp --batch_size_training 64
# --dist_checkpoint_root_folder ... --pure_bf16`: llama-recipes' finetuning.py under another name, read as an own
# HF script with eight unknown flags before.
def test_a_renamed_llama_recipes_finetuning_copy_is_read_as_llama_recipes():
    result = _check("torchrun --nnodes 1 --nproc_per_node 2 finetuning_llama.py --batch_size_training 64 "
                    "--enable_fsdp --dist_checkpoint_root_folder d --dist_checkpoint_folder f --model_name m "
                    "--use_peft --peft_method lora --pure_bf16")
    assert result.framework == "llama-recipes" and result.setup.engine == "fsdp1"
    assert any("finetuning_llama.py" in u for u in result.unknown)


def test_a_renamed_litgpt_script_copy_is_read_as_litgpt():
    result = _check("python finetune/lora_13b.py --data_dir d --checkpoint_dir c --precision bf16-true "
                    "--quantize bnb.nf4-dq")
    assert result.framework == "litgpt" and result.setup.adapter == "lora" and result.setup.quantization == "4bit"
    assert any("lora_13b.py" in u for u in result.unknown)


# Class: world size read as 1 where the launch plainly starts one process per GPU of the machine.

# okeeper/LLaMA-Factory qwen/train.sh: `llamafactory-cli train --stage sft ...` with no CUDA_VISIBLE_DEVICES, which
# runs torchrun over every GPU of the machine (src/llamafactory/cli.py: get_device_count() > 1).
def test_llamafactory_cli_without_visible_devices_evaluates_one_and_several_processes():
    line = "llamafactory-cli train --stage sft --model_name_or_path m --finetuning_type lora --output_dir o"
    result = _check(line)
    assert "world_size" in result.unsure
    pinned = _check("env CUDA_VISIBLE_DEVICES=0,1 " + line)
    assert pinned.setup.world_size == 2 and "world_size" not in pinned.unsure


# YerongLi/ChatGLM-Efficient-Tuning train.sh: `python src/train_sft.py --finetuning_type lora --quantization_bit 4`,
# LLaMA-Efficient-Tuning's per-stage script before train_bash.py, read as an own HF script (checkpointing off) before.
def test_llama_efficient_tuning_per_stage_script_is_read_as_llama_factory():
    result = _check("python src/train_sft.py --do_train --dataset d --finetuning_type lora --output_dir o --fp16 "
                    "--quantization_bit 4")
    assert result.framework == "llama-factory" and result.setup.stage == "sft"
    assert result.setup.checkpointing == "all" and result.setup.quantization == "4bit"
    # the common name alone, without LLaMA-Factory's flags, is someone's own script
    assert _check("python src/train_sft.py --model_name_or_path m --lora_r 8 --output_dir o").framework != \
        "llama-factory"


# Class: precision read as mixed where the launch plainly trains the weights in half precision.

# puzhiyuan/AiO train/ms-swift/sft/full/train_ddp.sh: `NPROC_PER_NODE=8 swift sft --train_type full --torch_dtype
# bfloat16` without --deepspeed: ms-swift's prepare_model keeps a full run's weights in the loaded dtype.
def test_ms_swift_full_bf16_without_deepspeed_trains_pure_bf16_weights():
    line = "env NPROC_PER_NODE=8 swift sft --model m --train_type full --torch_dtype bfloat16 --dataset d"
    assert _check(line).setup.precision == "bf16"
    assert _check(line + " --deepspeed zero2").setup.precision == "bf16-mixed"  # DeepSpeed's fp32 master weights
    assert _check(line.replace("full", "lora")).setup.precision == "bf16-mixed"
