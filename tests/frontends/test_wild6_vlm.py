"""A sixth sweep of users' own launches, for image-text fine-tuning (Qwen-VL / Phi-3-vision / Gemma-3 fine-tuning
forks, InternVL and MiniCPM-V shells, LLaMA-Factory lines): the classes check misread. Each input is a short
synthetic script or line of the same shape; the comment names the public repository that showed the class."""

from __future__ import annotations

import shlex

from loraflow.frontends import from_command
from loraflow.frontends.shell import command_from_script
from loraflow.frontends.verdict import check_setup


def _check(line: str, versions: dict | None = None):
    return from_command(shlex.split(line), versions or {})


def _findings(line: str) -> dict[str, bool]:
    """Rule id -> whether it holds whatever is unknown (True) or only in some case (False)."""
    report = check_setup(lambda v: _check(line, v), {})
    return {f.rule.id: f.holds_if is None for f in report.findings}


# earliswell/Phi3-Vision-Finetune and clh124/Qwen2.5-VL-Finetune scripts/finetune_lora.sh: `deepspeed
# src/training/train.py --lora_enable True --lora_namespan_exclude ... --gradient_checkpointing True` with the script
# elsewhere. Every release of 2U1's script hooks the embeddings (its use_reentrant changed between releases, so that
# question stays).
def test_qwen_vl_finetune_lineage_settles_hook_and_reentrancy():
    line = ("deepspeed src/train/train_sft.py --lora_enable True --lora_namespan_exclude \"['lm_head']\" "
            "--model_id Qwen/Qwen2.5-VL-3B-Instruct --freeze_llm True --freeze_vision_tower True "
            "--gradient_checkpointing True --bf16 True --output_dir out")
    result = _check(line)
    assert result.setup.input_grad_hook is True and "input_grad_hook" not in result.unsure
    assert "reentrant" in result.unsure
    # A `src/train/train.py` without the lineage's flags is some other script: still asked.
    other = _check("python src/train/train.py --lora_enable True --gradient_checkpointing True --output_dir o")
    assert "input_grad_hook" in other.unsure


# Khang-9966/Vintern-GRPO internvl_chat/shell/.../ocr.sh: `--freeze_backbone True --use_backbone_lora 16
# --use_llm_lora 16 --grad_checkpoint True` on InternVL's own script: the ViT's adapters sit behind InternViT's
# reentrant checkpoint with no hook on the patch embedding, so they never learn while the LLM's do.
def test_internvl_backbone_lora_behind_reentrant_vit_checkpoint_is_silent():
    base = ("torchrun --nproc_per_node 1 internvl/train/internvl_chat_finetune.py --model_name_or_path "
            "OpenGVLab/InternVL2-8B --freeze_llm True --freeze_backbone True --use_llm_lora 16 "
            "--grad_checkpoint True --bf16 True --output_dir out")
    found = _findings(base + " --use_backbone_lora 16")
    assert found.get("reentrant-partial-silent") is True
    assert "reentrant-partial-silent" not in _findings(base)  # no adapters in the ViT: nothing left behind


# JJH12234/ScaleBench Code/finetune/InternVL3.sh: `--model_name_or_path X \` then `#--model_name_or_path Y \` lines,
# then the rest of the flags: bash ends the command at the comment, so the flags after it never reach the launch.
def test_a_comment_line_inside_the_continued_command_is_said(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("llamafactory-cli train \\\n  --stage sft \\\n  --model_name_or_path a/b \\\n"
                      "  #--model_name_or_path a/c \\\n  --finetuning_type lora \\\n  --fp16 True\n")
    argv = command_from_script(str(script))
    assert argv == ["llamafactory-cli", "train", "--stage", "sft", "--model_name_or_path", "a/b"]
    result = from_command(["bash", str(script)], {})
    assert any("--finetuning_type" in n and "comment line" in n for n in result.notes)
    # A comment after the last flag cuts nothing.
    script.write_text("llamafactory-cli train \\\n  --stage sft \\\n  --fp16 True\n  #--report_to none\n")
    assert not any("comment line" in n for n in from_command(["bash", str(script)], {}).notes)
