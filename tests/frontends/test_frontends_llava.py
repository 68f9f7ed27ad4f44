"""LLaVA's train.py and its lineage (`llava/train/train.py`, `train_mem.py`), read from the launch line when the
script is not here: LLaVA-1.5's published LoRA recipe (tests/fixtures/corpus/check/scripts/011, haotian-liu/LLaVA
scripts/v1_5/finetune_lora.sh) and the launch of haotian-liu/LLaVA#363, whose fp16 cast of the model before
get_peft_model left the trained projector in fp16 under the Trainer's GradScaler."""

from __future__ import annotations

import json
import shlex

from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import detect, from_command, run_check
from loraflow.frontends.argv import command_from_script

RECIPE = ROOT / "tests" / "fixtures" / "corpus" / "check" / "scripts" / "011-llava15-lora-zero3.sh"
PINNED = {"torch": Version("2.1.2"), "transformers": Version("4.37.2"), "deepspeed": Version("0.12.6"),
          "accelerate": Version("0.21.0"), "peft": Version("0.6.0")}
# https://github.com/haotian-liu/LLaVA/issues/363 (the launch as posted, paths shortened)
ISSUE_363 = ("python llava/train/train.py --lora_enable True --model_name_or_path weights/vicuna-7b-v1.3 --version v1 "
             "--data_path data/llava_instruct_150k.json --image_folder data/train2017 --vision_tower "
             "openai/clip-vit-large-patch14 --pretrain_mm_mlp_adapter weights/projector.bin --mm_vision_select_layer -2 "
             "--mm_use_im_start_end True --fp16 True --output_dir out --num_train_epochs 3 "
             "--per_device_train_batch_size 1 --tf32 False --model_max_length 2048 --gradient_checkpointing True "
             "--lazy_preprocess True --report_to wandb")


def check(argv: list[str], versions: dict) -> tuple[set[str], int]:
    doc = json.loads(run_check(argv, None, [], dict(versions), True)[0])
    return {f["rule"] for f in doc["findings"] if f["impact"] in ("crash", "silent")}, doc["exit_code"]


def test_the_published_lora_recipe_reads_as_llava_s_code_sets_it_up_and_is_clean(monkeypatch):
    monkeypatch.chdir(RECIPE.parent)
    argv = command_from_script(str(RECIPE))
    assert detect(argv) == "llava"
    s = from_command(argv, PINNED).setup
    assert (s.adapter, s.engine, s.zero_stage, s.checkpointing, s.input_grad_hook) == ("lora", "deepspeed", 3, "all",
                                                                                       True)
    assert (s.image_text, s.frozen_modules, s.tower_adapters, s.towers_full) == (True, True, False, True)
    assert s.image_every_rank and s.image_safe_truncation and s.precision == "bf16-mixed"
    assert check(argv, PINNED) == (set(), 0)


def test_lora_at_16_bits_casts_the_trained_projector_to_the_half_dtype_outside_deepspeed():
    serious, code = check(shlex.split(ISSUE_363), PINNED)
    assert "fp16-trainable-unscale" in serious and code == 2
    bf16 = shlex.split(ISSUE_363.replace("--fp16 True", "--bf16 True"))
    assert from_command(bf16, PINNED).setup.precision == "bf16"
    assert "bf16-lost-updates" in check(bf16, PINNED)[0]  # the projector trains in bf16 with no float32 copy


def test_bits_4_quantizes_the_language_model_and_keeps_mixed_precision():
    s = from_command(shlex.split(ISSUE_363.replace("--fp16 True", "--bf16 True --bits 4")), PINNED).setup
    assert (s.quantization, s.precision) == ("4bit", "bf16-mixed")
