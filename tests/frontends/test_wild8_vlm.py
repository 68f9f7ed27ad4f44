"""An eighth sweep of users' own launches, for image-text fine-tuning beyond the Qwen-VL / InternVL lines (LLaVA-NeXT
and OneVision, Video-LLaVA, mPLUG-Owl2, Bunny, ShareGPT4V, TinyLLaVA, ...): the classes check misread. Each input is
a short synthetic launch of the same shape; the comment names the public repository that showed the class."""

from __future__ import annotations

import json
import shlex

from packaging.version import Version

from loraflow.frontends import detect, from_command, run_check

LLAVA_FLAGS = ("--model_name_or_path lmms-lab/llava-onevision-qwen2-7b-ov --version qwen_1_5 --data_path d.yaml "
               "--image_folder img --vision_tower google/siglip-so400m-patch14-384 --mm_projector_type mlp2x_gelu "
               "--mm_vision_select_layer -2 --mm_use_im_start_end False --image_aspect_ratio anyres_max_9 "
               "--bf16 True --output_dir out --model_max_length 32768 --lazy_preprocess True")


def _argv(text: str) -> list[str]:
    return shlex.split(text)


def serious(argv: list[str]) -> set[str]:
    doc = json.loads(run_check(argv, None, [], {}, True)[0])
    return {f["rule"] for f in doc["findings"] if f["impact"] in ("crash", "silent") and f["holds_if"] is None}


# LLaVA-VL/LLaVA-NeXT scripts/train/finetune_onevision.sh: `--mm_tunable_parts="mm_mlp_adapter,mm_language_model"`
# and no --gradient_checkpointing flag in some forks' copies. NeXT's train.py defaults gradient_checkpointing to True,
# freezes the model and unfreezes each part named; mm_language_model unfreezes every language-model weight, the
# LoRA base weights too (llava/train/train.py, "Deciding train which part of the model").
def test_llava_next_tunable_parts_decide_what_trains_and_checkpointing_defaults_on():
    argv = _argv("deepspeed --num_gpus 8 llava/train/train_mem.py --deepspeed scripts/zero3.json "
                 f"{LLAVA_FLAGS} --mm_tunable_parts mm_mlp_adapter,mm_language_model")
    assert detect(argv) == "llava"
    result = from_command(argv, {})
    s = result.setup
    assert s.checkpointing == "all" and "LLaVA-NeXT" in result.sources["checkpointing"]
    assert (s.adapter, s.frozen_modules, s.towers_full) == ("full", True, True)
    assert not [u for u in result.unknown if "mm_tunable_parts" in u]
    every = from_command(argv[:-1] + ["mm_vision_tower,mm_mlp_adapter,mm_language_model"], {}).setup
    assert not every.frozen_modules
    # Original LLaVA's train.py (no NeXT-only flag) keeps the HF default: checkpointing off unless asked.
    plain = from_command(_argv(f"deepspeed --num_gpus 8 llava/train/train_mem.py {LLAVA_FLAGS}"), {}).setup
    assert plain.checkpointing == "off"


def test_llava_next_lora_with_the_language_model_among_the_parts_trains_every_weight():
    argv = _argv(f"torchrun --nproc_per_node 2 llava/train/train_mem.py --lora_enable True {LLAVA_FLAGS} "
                 "--mm_tunable_parts mm_vision_tower,mm_mlp_adapter,mm_language_model")
    result = from_command(argv, {})
    assert result.setup.adapter == "full" and "LoRA's base weights" in result.sources["adapter"]
    # bits 16 casts the model to bf16 before get_peft_model; outside DeepSpeed every weight then trains in bf16.
    assert "bf16-lost-updates" in serious(argv)
    assert "--mm_tunable_parts" in result.flags["adapter"]
    # Without mm_language_model the LoRA weights stay frozen with the rest while the projector trains: the adapter
    # silently never learns (rule adapter-frozen-others-train), not a crash.
    only = from_command(argv[:-1] + ["mm_mlp_adapter"], {})
    assert only.setup.adapter == "lora" and only.setup.adapter_loaded_frozen and only.setup.towers_trainable
    found = serious(argv[:-1] + ["mm_mlp_adapter"])
    assert "adapter-frozen-others-train" in found and "adapter-loaded-frozen" not in found


# PKU-YuanGroup/Video-LLaVA scripts/v1_5/finetune_lora.sh (and MoE-LLaVA's): LLaVA's train.py with `--image_tower`
# / `--video_tower` in place of --vision_tower. Read as a generic script, check asked whether it hooks the embeddings
# and whether text-only samples skip the tower, which LLaVA's code answers (enable_input_require_grads; a blank
# image for a text-only sample).
def test_video_llava_image_and_video_towers_mark_the_llava_lineage():
    argv = _argv("deepspeed videollava/train/train_mem.py --lora_enable True --deepspeed ./scripts/zero2.json "
                 "--model_name_or_path lmsys/vicuna-7b-v1.5 --version v1 --data_path ft.json --image_folder img "
                 "--image_tower LanguageBind/LanguageBind_Image --video_folder vid --video_tower "
                 "LanguageBind/LanguageBind_Video_merge --mm_projector_type mlp2x_gelu --mm_vision_select_layer -2 "
                 "--mm_use_im_start_end False --bf16 True --output_dir out --model_max_length 2048 "
                 "--gradient_checkpointing True --lazy_preprocess True")
    assert detect(argv) == "llava"
    result = from_command(argv, {})
    s = result.setup
    assert (s.input_grad_hook, s.image_text, s.image_every_rank, s.image_safe_truncation) == (True,) * 4
    assert not s.tower_adapters and "torch.no_grad" in result.sources["tower_adapters"]
    assert not {"input_grad_hook", "image_every_rank", "reentrant"} & set(result.unsure)
    assert not [u for u in result.unknown if "image_tower" in u or "video_tower" in u]


# X-PLUG/mPLUG-Owl mPLUG-Owl2/scripts/finetune_lora.sh: `deepspeed mplug_owl2/train/train_mem.py --lora_enable True
# ... --tune_visual_abstractor True --freeze_vision_model True`. Its train.py calls model.requires_grad_(True) after
# get_peft_model, so the "LoRA" run trains every language-model weight; check read it as adapters on a frozen base.
def test_mplug_owl2_lora_trains_every_language_model_weight():
    line = ("deepspeed mplug_owl2/train/train_mem.py --lora_enable True --lora_r 128 --visual_abstractor_lr 2e-5 "
            "--model_name_or_path MAGAer13/mplug-owl2-llama2-7b --version v1 --data_path d.json --image_folder x "
            "--bf16 True --output_dir out --model_max_length 2048 --gradient_checkpointing True "
            "--tune_visual_abstractor True --freeze_vision_model True --lazy_preprocess True")
    assert detect(_argv(line)) == "llava"
    result = from_command(_argv(line), {})
    s = result.setup
    assert (s.adapter, s.frozen_modules, s.towers_full, s.tower_adapters) == ("full", True, True, False)
    assert s.image_every_rank and s.input_grad_hook
    assert not [u for u in result.unknown if "visual_abstractor" in u or "freeze_vision_model" in u]
    # Outside DeepSpeed the model was cast to bf16 before get_peft_model: every weight trains in pure bf16.
    assert "bf16-lost-updates" in serious(_argv(line.replace("deepspeed ", "torchrun --nproc_per_node 2 ")))


# LLaVA-VL/LLaVA-NeXT scripts/train/dpo.sh: `torchrun ... llava/train/train_dpo.py --dpo_alpha 1.0 --beta 0.1
# --gamma 0 --mm_tunable_parts=...`: read as LLaVA's SFT train.py, with DPO's flags not understood.
def test_llava_next_train_dpo_is_a_dpo_run():
    argv = _argv("torchrun --nproc_per_node 8 llava/train/train_dpo.py --deepspeed scripts/zero3.json "
                 f"{LLAVA_FLAGS} --dpo_alpha 1.0 --beta 0.1 --gamma 0 "
                 "--mm_tunable_parts=mm_vision_tower,mm_mlp_adapter,mm_language_model")
    result = from_command(argv, {})
    assert result.setup.stage == "dpo" and "DPOTrainer" in result.sources["stage"]
    assert result.setup.checkpointing == "all"  # train_dpo.py's TrainingArguments default it on too
    assert not [u for u in result.unknown if "beta" in u or "gamma" in u or "dpo_alpha" in u]


# BAAI-DCAI/Bunny script/train/tutorials (Bunny-v1.1-Llama-3-8B-V recipe-2): `deepspeed bunny/train/train.py
# --lora_enable True --model_type llama3-8b --use_s2 True --unfreeze_vision_tower True ...`: Bunny's own flags,
# the SigLIP tower set trainable after LoRA (bunny/train/train.py).
def test_bunny_unfreeze_vision_tower_trains_the_tower_in_full():
    argv = _argv("deepspeed bunny/train/train.py --lora_enable True --deepspeed zero3.json --model_name_or_path "
                 "meta-llama/Meta-Llama-3-8B-Instruct --model_type llama3-8b --version llama --data_path d.json "
                 "--image_folder img --vision_tower google/siglip-so400m-patch14-384 --use_s2 True "
                 "--unfreeze_vision_tower True --mm_projector_type mlp2x_gelu --bf16 True --output_dir out "
                 "--gradient_checkpointing True")
    result = from_command(argv, {})
    assert "unfreeze_vision_tower" in result.sources["towers_full"]
    assert result.setup.frozen_modules  # LoRA keeps the language model's base frozen
    assert not [u for u in result.unknown if "use_s2" in u or "unfreeze_vision_tower" in u or "model_type" in u]


# TinyLLaVA/TinyLLaVA_Factory scripts/train/lora/finetune_lora.sh: `deepspeed tinyllava/train/train.py
# --training_recipe $TRAIN_RECIPE --tune_type_llm lora --tune_type_vision_tower frozen --tune_type_connector full`.
# Its vision_tower and mm_vision_select_layer flags made check read it as LLaVA's train.py with no --lora_enable:
# a full fine-tune. The recipe (training_recipe/lora_recipe.py) puts LoRA on each part whose tune type is lora, and
# hooks only the language model's embeddings under checkpointing (training_recipe/base.py).
TINY = ("deepspeed --include localhost:0,1 tinyllava/train/train.py --deepspeed ./scripts/zero2.json "
        "--data_path d.json --image_folder img --is_multimodal True --conv_version phi "
        "--model_name_or_path microsoft/phi-2 "
        "--vision_tower google/siglip-so400m-patch14-384 --vision_tower2 '' --connector_type mlp2x_gelu "
        "--mm_vision_select_layer -2 --fp16 True --training_recipe $RECIPE --tune_type_llm lora "
        "--tune_type_vision_tower frozen --tune_type_connector full --lora_r 128 --output_dir out "
        "--gradient_checkpointing True")


def test_tinyllava_recipe_flags_choose_lora_per_part():
    result = from_command(_argv(TINY), {})
    s = result.setup
    assert (s.adapter, s.frozen_modules, s.towers_full, s.tower_adapters) == ("lora", True, True, False)
    assert not [u for u in result.unknown if "tune_type" in u or "training_recipe" in u]
    # tinyllava/train/custom_finetune.py loads the model from --pretrained_model_path: no --vision_tower flag.
    custom = from_command(_argv(TINY.replace("tinyllava/train/train.py", "tinyllava/train/custom_finetune.py")
                                .replace("--vision_tower google/siglip-so400m-patch14-384 ", "")), {}).setup
    assert custom.image_text and custom.adapter == "lora" and custom.image_every_rank
    full = from_command(_argv(TINY.replace("--tune_type_llm lora", "--tune_type_llm full")
                              .replace("$RECIPE", "common")), {}).setup
    assert full.adapter == "full"


def test_tinyllava_vision_lora_behind_reentrant_checkpointing_gets_no_gradient():
    line = TINY.replace("--tune_type_vision_tower frozen", "--tune_type_vision_tower lora").replace("$RECIPE", "lora")
    old = {"transformers": Version("4.40.0"), "torch": Version("2.1.2"), "peft": Version("0.10.0"),
           "deepspeed": Version("0.14.0")}
    doc = json.loads(run_check(_argv(line), None, [], old, True)[0])
    assert "reentrant-partial-silent" in {f["rule"] for f in doc["findings"] if f["holds_if"] is None}
    assert "reentrant-partial-silent" not in serious(_argv(line))  # transformers 5: non-reentrant by default


# NVlabs/VILA scripts/NVILA-Lite/sft.sh: `torchrun ... llava/train/train_mem.py --tune_vision_tower True
# --tune_mm_projector True --tune_language_model True ...` on the same path as LLaVA's script but VILA's own
# train.py: check read the tower as frozen and the --tune_* flags as not understood.
VILA_LINE = ("torchrun --nproc_per_node 8 llava/train/train_mem.py --deepspeed scripts/zero3.json --model_name_or_path "
             "Efficient-Large-Model/NVILA-Lite-8B --data_mixture nvila-sft --vision_tower "
             "Efficient-Large-Model/paligemma-siglip-so400m-patch14-448 --mm_projector mlp_downsample_3x3_fix "
             "--mm_vision_select_layer -2 --bf16 True --output_dir out --gradient_checkpointing True")


def test_vila_tune_flags_decide_each_part():
    full = from_command(_argv(VILA_LINE + " --tune_vision_tower True --tune_mm_projector True "
                                          "--tune_language_model True"), {})
    s = full.setup
    assert (s.adapter, s.frozen_modules, s.towers_full) == ("full", False, True)
    assert not [u for u in full.unknown if "tune_" in u or "data_mixture" in u]
    lora = from_command(_argv(VILA_LINE + " --lora_enable True --lora_llm True --lora_vt True "
                                          "--tune_mm_projector True"), {}).setup
    assert (lora.adapter, lora.frozen_modules, lora.tower_adapters, lora.tower_input_hook) == ("lora", True, True,
                                                                                               True)


# InternLM/InternLM-XComposer finetune/finetune_lora.sh: `torchrun $DISTRIBUTED_ARGS finetune.py --fix_vit True
# --fix_sampler True --use_lora True --gradient_checkpointing True ...` with the script elsewhere: check asked whether
# it hooks the embeddings, which its finetune.py does after get_peft_model.
def test_xcomposer_finetune_lineage_settles_the_hook():
    line = ("torchrun --nproc_per_node 8 finetune.py --model_name_or_path internlm/internlm-xcomposer2-vl-7b "
            "--img_size 490 --bf16 True --fix_vit True --fix_sampler True --use_lora True --output_dir out "
            "--max_length 4096 --deepspeed ds_config_zero2.json --gradient_checkpointing True")
    result = from_command(_argv(line), {})
    assert result.setup.input_grad_hook and "input_grad_hook" not in result.unsure
    # Another finetune.py without XComposer's flags is still asked.
    other = from_command(_argv("torchrun --nproc_per_node 8 finetune.py --model_name_or_path m --use_lora True "
                               "--output_dir out --gradient_checkpointing True"), {})
    assert "input_grad_hook" in other.unsure


# xiaoachen98/Open-LLaVA-NeXT scripts: `--unfreeze_mm_vision_tower True --mm_vision_tower_lr 2e-6` on its own
# llava/train/train.py, whose TrainingArguments keep the HF default (no checkpointing) unlike LLaVA-NeXT's: the flags
# train the tower in full in both, and only NeXT-only flags imply NeXT's checkpointing default.
def test_unfreeze_mm_vision_tower_trains_the_tower_without_implying_next_checkpointing():
    argv = _argv(f"deepspeed --num_gpus 8 llava/train/train_mem.py --deepspeed zero3.json {LLAVA_FLAGS} "
                 "--unfreeze_mm_vision_tower True --mm_vision_tower_lr 2e-6")
    result = from_command(argv, {})
    s = result.setup
    assert s.checkpointing == "off" and s.towers_full and not s.frozen_modules
    assert "unfreeze_mm_vision_tower" in result.sources["towers_full"]
    assert not [u for u in result.unknown if "vision_tower" in u]
