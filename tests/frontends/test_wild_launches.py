"""Launches as users write them in their own repositories (not the frameworks' examples): the spellings a sweep of
public launch scripts found misread. Each input is a short synthetic line of the same shape; the comment names the
public repository that showed the class."""

from __future__ import annotations

import shlex

import pytest

from loraflow.errors import LoraflowError
from loraflow.frontends import from_command
from loraflow.frontends.shell import command_from_script


def _hf(line: str, versions: dict | None = None):
    return from_command(shlex.split(line), versions or {})


# taishan1994/Llama3.1-Finetuning script/fintune_lora_qwen2.5.sh (`VAR=1 \` lines, then `nohup torchrun ... &`);
# a SLURM job's `apptainer exec --nv img.sif accelerate launch ...`; `conda run -n env python ...`.
def test_a_wrapper_command_before_the_launcher_is_read_past(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus 4\nNCCL_P2P_DISABLE=1 \\\nNCCL_IB_DISABLE=1 \\\nnohup torchrun \\\n"
                      "--nproc_per_node 8 train.py --use_lora --bf16 True --output_dir o &\n")
    assert command_from_script(str(script)) == ["NCCL_P2P_DISABLE=1", "NCCL_IB_DISABLE=1", "torchrun",
                                                "--nproc_per_node", "8", "train.py", "--use_lora", "--bf16", "True",
                                                "--output_dir", "o"]
    script.write_text("apptainer exec --nv -B /data:/data img.sif accelerate launch --num_processes 2 t.py --x 1\n")
    assert command_from_script(str(script))[:3] == ["accelerate", "launch", "--num_processes"]
    script.write_text("CUDA_VISIBLE_DEVICES=0 conda run -n lf python train.py --lora_r 8\n")
    assert command_from_script(str(script)) == ["CUDA_VISIBLE_DEVICES=0", "python", "train.py", "--lora_r", "8"]
    script.write_text("time bash other.sh\n")  # a wrapper around no launcher is no launch line
    with pytest.raises(LoraflowError, match="found no launch line"):
        command_from_script(str(script))


# A SLURM script's `python main.py --enable_lora`: nothing of the HF Trainer's, but the script's own adapter switch.
def test_a_script_with_only_its_own_adapter_switch_is_read_not_refused():
    result = _hf("python main.py --enable_lora")
    assert result.framework == "hf" and result.setup.adapter == "lora"


# A SLURM job launching `accelerate launch --module src.train_sft -- model.lora=true sft.packing=false` (Hydra).
def test_hydra_overrides_after_a_module_are_read_by_their_last_key():
    result = _hf("accelerate launch --num_processes 2 --module src.train_sft -- model=qwen model.lora=true "
                 "sft.per_device_train_batch_size=1")
    assert result.framework == "hf" and result.setup.adapter == "lora"
    assert not any("per_device_train_batch_size" in u for u in result.unknown)


# 01xianyi/Qwen2.5-3B-ChID- (`--quantization_bit 8 --lora_r 8`), artidoro/qlora-style `--bits 4 --double_quant`,
# bupticybee/FastLoRAChat (`--base_model --lora_target_modules`): flags TRL's parser would reject make the launch a
# script of its own, so its LoRA flags are its own (no TRL fork that trains every weight).
def test_flags_trl_would_reject_leave_only_the_scripts_own_reading():
    result = _hf("deepspeed --num_gpus 4 danka.py --model_name_or_path Qwen/Qwen2.5-3B --quantization_bit 8 "
                 "--lora_r 8 --output_dir o --fp16")
    assert result.setup.adapter == "lora" and result.setup.quantization == "8bit"
    assert "trainer_library" not in result.forks
    qlora = _hf("python qlora.py --model_name_or_path M --bits 4 --lora_r 64 --lora_modules all --double_quant "
                "--quant_type nf4 --output_dir o")
    assert qlora.setup.adapter == "lora" and qlora.setup.quantization == "4bit"
    assert not any(u.startswith(("--lora_modules", "--double_quant", "--quant_type")) for u in qlora.unknown)
    # Only flags TRL's dataclasses have (argparse takes --model_name for --model_name_or_path): both readings stay.
    both = _hf("python my_sft.py --model_name M --lora_r 8 --output_dir o")
    assert set(both.forks["trainer_library"][0]) == {False, True}


# A torchrun `sft_qwen_quantization.py --quantization_bit=4` with no adapter flag: a script that loads its base in
# k bits trains adapters on it, not every weight (no kbit-full-finetune crash claimed).
def test_a_scripts_own_kbit_load_without_an_adapter_flag_reads_as_lora():
    result = _hf("torchrun --nproc_per_node=2 sft_q.py --pretrained_model_name_or_path M --output_dir o "
                 "--quantization_bit=4")
    assert result.setup.adapter == "lora" and result.setup.quantization == "4bit"


# `torchrun finetune_qwen25_ner_lora.py --deepspeed ds.json`, FastChat's `train_lora.py --q_lora False`.
def test_the_script_name_and_q_lora_false_say_lora():
    named = _hf("torchrun --nproc_per_node=4 finetune_ner_lora.py --model_id M --bf16 --output_dir o")
    assert named.setup.adapter == "lora"
    assert _hf("python train.py --output_dir o --bf16").setup.adapter == "full"
    fastchat = _hf("deepspeed --num_gpus 4 fastchat/train/train_lora.py --model_name_or_path M --lora_r 8 "
                   "--data_path d --q_lora False --output_dir o")
    assert fastchat.setup.adapter == "lora" and fastchat.setup.quantization in (None, "none")


# `--train_mode lora` (a VLM trainer's vlm_train.py), `--finetune lora` (kenziyuliu/lora-fairness main.py),
# `--adapter_name lora` (LLM-Adapters-derived lora_finetune.py): the script's own choice of method.
def test_a_scripts_own_spelling_of_the_method_choice():
    for flag in ("--train_mode lora", "--finetune lora", "--adapter_name lora", "--peft_method lora"):
        result = _hf(f"deepspeed --num_gpus 2 train.py --model_name_or_path M --output_dir o {flag}")
        assert result.setup.adapter == "lora", flag
    assert _hf("deepspeed --num_gpus 2 train.py --output_dir o --train_mode full").setup.adapter == "full"


# MobileVLM's `deepspeed mobilevlm/train/train_mem.py --vision_tower ... --mm_projector_type ldpnetv2`, a user's
# `llava/train/train_mem_hf.py`: LLaVA's train.py flags under another path are its lineage.
def test_llava_derived_scripts_under_other_paths_are_read_as_llava():
    result = _hf("deepspeed --num_gpus 2 mobilevlm/train/train_mem.py --lora_enable True --lora_r 8 "
                 "--model_name_or_path M --vision_tower openai/clip-vit-large-patch14-336 "
                 "--mm_projector_type ldpnetv2 --bf16 True --output_dir o")
    assert result.framework == "llava" and result.setup.adapter == "lora" and result.setup.frozen_modules
    assert not any(u.startswith(("--vision_tower", "--mm_projector_type")) for u in result.unknown)
    plain = _hf("deepspeed --num_gpus 2 vlm/train.py --vision_tower v --output_dir o --bf16 True")
    assert plain.framework == "hf"  # --vision_tower alone is not LLaVA's mark


# nuclear-turning/LLaVA-zh scripts/train.sh: `--freeze_backbone True --tune_mm_mlp_adapter True` trains no LLM weight.
def test_llava_freeze_backbone_is_a_frozen_language_model():
    result = _hf("torchrun --nproc_per_node 1 llava/train/train_mem.py --model_name_or_path M --freeze_backbone True "
                 "--output_dir o")
    assert result.setup.adapter == "full" and result.setup.frozen_modules
    assert "freezes the language model" in result.sources["adapter"]


# A DeepSpeed-Chat main.py copy launched with `--use_lora --lora_r 64` (upstream spells it --lora_dim and its argparse
# refuses --use_lora): the copy's own LoRA, not full fine-tuning with three flags not understood.
def test_a_deepspeed_chat_copy_with_its_own_lora_switch():
    result = _hf("deepspeed main.py --data_split 2,4,4 --model_name_or_path facebook/opt-1.3b --zero_stage 3 "
                 "--lora_r 64 --use_lora --lora_alpha 128")
    assert result.framework == "deepspeed-chat" and result.setup.adapter == "lora"
    assert not any(u.startswith(("--use_lora", "--lora_r", "--lora_alpha")) for u in result.unknown)
    upstream = _hf("deepspeed main.py --data_split 2,4,4 --model_name_or_path m --zero_stage 3 --lora_dim 128")
    assert upstream.setup.adapter == "full"


# flashlin/Samples torch-qa/LLaMA-Factory/f2.sh: `#--lora_target q_proj,v_proj \` right above the launch line.
def test_a_comment_lines_trailing_backslash_does_not_swallow_the_launch(tmp_path):
    script = tmp_path / "f2.sh"
    script.write_text("# an older run\n#--lora_target q_proj,v_proj \\\nCUDA_VISIBLE_DEVICES=0 python train.py \\\n"
                      "--lora_r 8 \\\n    # --bf16 true \\\n    # --fp16 false\n")
    assert command_from_script(str(script)) == ["CUDA_VISIBLE_DEVICES=0", "python", "train.py", "--lora_r", "8"]


# A Qwen2.5-VL QLoRA launch of a script of its own (`src/train/train.py --lora_enable true --bits 4` under ZeRO-3):
# the storage dtype is its own BitsAndBytesConfig's, so both values are evaluated, not TRL's default asserted.
def test_a_scripts_own_4bit_load_leaves_the_storage_dtype_to_its_code():
    result = _hf("torchrun --nproc_per_node 2 src/train/train.py --deepspeed zero3.json --model_id M "
                 "--lora_enable true --bits 4 --output_dir o --bf16 True")
    assert result.setup.quantization == "4bit" and "quant_storage_matches" in result.unsure
    trl = _hf("python sft.py --model_name_or_path M --use_peft --load_in_4bit --output_dir o --dataset_name d")
    assert "quant_storage_matches" not in trl.unsure


# A MiniCPM-V finetune_lora.sh copy launching `/home/u/anaconda3/envs/MiniCPMV/bin/torchrun $DISTRIBUTED_ARGS ...`.
def test_a_launcher_named_by_its_path_in_an_environment():
    result = _hf("/home/u/anaconda3/envs/x/bin/torchrun --nproc_per_node 2 finetune.py --use_lora true "
                 "--output_dir o --bf16 true")
    assert result.framework == "hf" and result.setup.world_size == 2 and result.setup.adapter == "lora"


# A research repo's `header="torchrun --nproc_per_node=1 -m src.train.sft --lora True ..."; $header`.
def test_a_module_of_the_users_own_under_torchrun():
    result = _hf("torchrun --nproc_per_node 2 -m src.train.sft --model_name_or_path M --lora True --lora_r 128 "
                 "--output_dir o --bf16 True")
    assert result.framework == "hf" and result.setup.adapter == "lora" and result.setup.world_size == 2


# daje0601/AllinOne_LLM chapter3 (`torchrun --nproc_per_node=4 ./train.py --config config.yaml`, the config not in
# the repo's launch): no PEFT flag in the command says nothing when the config that would hold it is not here.
def test_no_peft_flag_with_an_unseen_training_config_leaves_the_adapter_open():
    result = _hf("torchrun --nproc_per_node=4 ./train.py --config config.yaml")
    assert set(result.unsure["adapter"][0]) == {"full", "lora"}
    seen = _hf("torchrun --nproc_per_node=4 ./train.py --output_dir o --bf16 True")
    assert seen.setup.adapter == "full" and "adapter" not in seen.unsure


# yafo-ai/y-trainer scripts/sft_ds.sh: `deepspeed --module start_training --use_deepspeed 'true' --use_lora 'true'`:
# a module without dots, and a DeepSpeed switch of the script's own (it calls deepspeed.initialize itself).
def test_a_scripts_own_deepspeed_switch_and_a_plain_module_name():
    result = _hf("deepspeed --include localhost:0,1 --module start_training --use_deepspeed true --use_lora true "
                 "--output_dir o")
    assert result.framework == "hf" and result.setup.engine == "deepspeed" and result.setup.adapter == "lora"
    assert "deepspeed_stage" in result.forks  # no stage given: every stage evaluated
    staged = _hf("deepspeed --num_gpus 2 train.py --use_deepspeed --zero_stage 3 --lora_rank 8 --output_dir o")
    assert staged.setup.zero_stage == 3 and not any(u.startswith(("--use_deepspeed", "--zero_stage"))
                                                    for u in staged.unknown)


# `cd LLaVA && deepspeed ...` and `source activate env; python ...` on one line (users' run scripts), `X=0,1 && ...`.
def test_the_launch_among_commands_chained_on_one_line(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("cd /work/x && CUDA_VISIBLE_DEVICES=0 torchrun --nproc_per_node 2 train.py --lora_r 8\n")
    assert command_from_script(str(script)) == ["CUDA_VISIBLE_DEVICES=0", "torchrun", "--nproc_per_node", "2",
                                                "train.py", "--lora_r", "8"]
    script.write_text("source activate lf; python train.py --use_lora > log.txt 2>&1\n")
    assert command_from_script(str(script)) == ["python", "train.py", "--use_lora"]
    script.write_text('CUDA_VISIBLE_DEVICES=0,1 && torchrun t.py --x "a && b" # c && d\n')
    assert command_from_script(str(script)) == ["CUDA_VISIBLE_DEVICES=0,1", "torchrun", "t.py", "--x", "a && b"]


# sotopia-lab/sotopia-rl scripts/train_sft.py: `from sotopia_rl import SotopiaSFTTrainer` is that package's trainer;
# its name holds "SFTTrainer", but TRL's defaults (checkpointing and bf16 on) are not its own.
def test_a_packages_own_trainer_named_like_trls_is_not_read_as_trl(tmp_path):
    script = tmp_path / "train_sft.py"
    script.write_text("import argparse\nfrom sotopia_rl import SotopiaSFTTrainer\n\n"
                      "parser = argparse.ArgumentParser()\nparser.add_argument('--use_lora', action='store_true')\n"
                      "args = parser.parse_args()\nSotopiaSFTTrainer(args).train()\n")
    result = _hf(f"python {script} --use_lora")
    assert result.setup.checkpointing == "off" and result.setup.precision == "fp32"
    assert any("from sotopia_rl" in u for u in result.unknown)
    trl = tmp_path / "t.py"
    trl.write_text("from trl import SFTTrainer, SFTConfig\n"
                   "SFTTrainer(model='m', args=SFTConfig(output_dir='o')).train()\n")
    assert _hf(f"python {trl}").setup.checkpointing == "all"  # TRL's own: gradient_checkpointing on by default
