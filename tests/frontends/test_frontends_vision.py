"""Frontends of `loraflow check` on image-text (vision-language) launches: the model recognised from its name or a
flag only image-text runs have, the towers each framework trains or adapts, and the vision rules that follow.

Pure parsing, as in test_frontends.py: launch lines in the style of the frameworks' own examples (MiniCPM-V
finetune_lora.sh, Qwen2-VL-Finetune, InternVL, TRL sft_vlm, LLaMA-Factory, ms-swift, Axolotl).
"""

from __future__ import annotations

import json
import shlex

import pytest
from packaging.version import Version

from loraflow.frontends import from_command, from_files, run_check
from loraflow.frontends.vision import family, targets_reach_towers

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}


def findings(argv: list[str] | None, versions: dict, framework: str | None = None,
             files: list[str] | None = None) -> dict[str, str | None]:
    """rule id -> the condition it holds under (None: whatever is unknown)."""
    doc = json.loads(run_check(argv, framework, files or [], versions, as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def cmd(text: str, versions: dict = CURRENT):
    return from_command(shlex.split(text), versions)


@pytest.mark.parametrize("name, fam", [
    ("Qwen/Qwen2-VL-7B-Instruct", "qwen-vl"), ("/mnt/models/Qwen2.5VL_3B", "qwen2.5-vl"),
    ("Qwen/Qwen3-VL-8B-Instruct", "qwen3-vl"), ("llava-hf/llava-1.5-7b-hf", "llava"),
    ("openbmb/MiniCPM-Llama3-V-2_5", "minicpm-v"), ("openbmb/MiniCPM-V-2_6", "minicpm-v"),
    ("OpenGVLab/InternVL2_5-8B", "internvl"), ("HuggingFaceTB/SmolVLM-Instruct", "idefics"),
    ("google/paligemma-3b-pt-224", "paligemma"), ("google/gemma-3-4b-it", "gemma-3"),
    ("microsoft/Phi-3.5-vision-instruct", "phi-vision"), ("meta-llama/Llama-3.2-11B-Vision-Instruct", "mllama"),
    ("moonshotai/Kimi-VL-A3B-Instruct", "other"),
    ("google/gemma-3-1b-it", None), ("Qwen/Qwen2.5-7B-Instruct", None), ("meta-llama/Meta-Llama-3-8B", None),
    ("mistralai/Mistral-7B-v0.1", None), ("builtin:tiny-base", None),
])
def test_image_text_models_are_recognised_by_name(name, fam):
    found = family(name)
    assert (found.name if found else None) == fam


def test_short_target_names_reach_the_tower_of_their_family_only():
    # Qwen2-VL's vision blocks are attn.qkv / attn.proj / mlp.fc1: q_proj stays in the language model there, but a
    # CLIP tower (LLaVA) has q_proj too; Qwen2.5-VL's vision MLP shares gate_proj with the language model.
    assert not targets_reach_towers("Qwen/Qwen2-VL-7B-Instruct", ["q_proj", "v_proj"])
    assert targets_reach_towers("Qwen/Qwen2-VL-7B-Instruct", ["proj", "qkv"])
    assert targets_reach_towers("llava-hf/llava-1.5-7b-hf", ["q_proj", "v_proj"])
    assert targets_reach_towers("Qwen/Qwen2.5-VL-3B-Instruct", ["gate_proj"])
    assert targets_reach_towers("any-model", ["all-linear"])
    assert not targets_reach_towers("llava-hf/llava-1.5-7b-hf", [r"language_model.*\.(q_proj|v_proj)"])


def test_minicpmv_flags_lora_llm_with_vision_tower_in_full():
    r = cmd("torchrun --nproc_per_node 8 finetune.py --model_name_or_path openbmb/MiniCPM-Llama3-V-2_5 "
            "--use_lora true --tune_vision true --tune_llm false --model_max_length 2048 "
            "--lora_target_modules 'llm\\..*layers\\.\\d+\\.self_attn\\.(q_proj|v_proj)' "
            "--gradient_checkpointing true --deepspeed ds_config_zero2.json --output_dir o")
    s = r.setup
    assert (s.image_text, s.adapter, s.towers_trainable, s.frozen_modules) == (True, "lora", True, True)
    assert not s.targets_all_towers and not s.tower_adapters
    assert "--tune_vision true" in r.sources["towers_trainable"]
    assert not [u for u in r.unknown if "model_max_length" in u or "tune_vision" in u]
    # Whether an image sample outgrows --model_max_length is in the data: the truncation rule holds only so.
    holds = findings(shlex.split("torchrun --nproc_per_node 8 finetune.py --model_name_or_path "
                                 "openbmb/MiniCPM-V-2_6 --use_lora true --tune_vision true --tune_llm false "
                                 "--model_max_length 2048 --output_dir o"), {})
    assert "model_max_length" in holds["image-tokens-truncated"]


QWEN_VL_FT = ("deepspeed src/train/train_sft.py --model_id Qwen/Qwen2.5-VL-3B-Instruct --lora_enable True "
              "--lora_namespan_exclude \"['lm_head', 'embed_tokens']\" --deepspeed zero3.json --bf16 True "
              "--gradient_checkpointing True --image_min_pixels 200704 --output_dir o ")


def test_qwen2vl_finetune_vision_lora_and_frozen_towers():
    r = cmd(QWEN_VL_FT + "--vision_lora True --freeze_vision_tower True --freeze_llm True --freeze_merger True")
    s = r.setup
    assert (s.image_text, s.tower_adapters, s.towers_trainable, s.frozen_modules) == (True, True, True, True)
    # find_target_linear_names targets Linear modules by full path: nothing is matched across towers.
    assert s.targets_all_towers is False and "lora_namespan_exclude" in r.sources["targets_all_towers"]
    assert not [u for u in r.unknown if "namespan" in u or "vision" in u or "freeze" in u or "pixels" in u]
    llm_only = cmd(QWEN_VL_FT + "--freeze_vision_tower False --freeze_llm True --tune_merger True").setup
    assert (llm_only.towers_trainable, llm_only.tower_adapters) == (True, False)
    frozen = cmd(QWEN_VL_FT + "--freeze_vision_tower True --freeze_llm True --freeze_merger True").setup
    assert (frozen.towers_trainable, frozen.frozen_modules) == (False, True)


def test_internvl_llm_lora_frozen_backbone_and_own_checkpoint_switch():
    base = ("torchrun --nproc_per_node=2 internvl/train/internvl_chat_finetune.py --model_name_or_path "
            "OpenGVLab/InternVL2_5-8B --freeze_llm True --freeze_mlp True --max_seq_length 8192 --output_dir o "
            "--deepspeed zero_stage1_config.json ")
    r = cmd(base + "--freeze_backbone True --use_llm_lora 16 --grad_checkpoint True")
    s = r.setup
    assert (s.image_text, s.adapter, s.frozen_modules, s.towers_trainable) == (True, "lora", True, False)
    assert s.checkpointing == "all" and "--grad_checkpoint True" in r.sources["checkpointing"]
    vit_lora = cmd(base + "--freeze_backbone True --use_backbone_lora 16").setup
    assert vit_lora.tower_adapters and vit_lora.towers_trainable
    assert cmd(base + "--freeze_backbone True --use_llm_lora 16 --grad_checkpoint False").setup.checkpointing == "off"


def test_trl_sft_all_linear_on_a_vlm_targets_every_tower_and_old_trl_loads_a_causal_lm():
    line = ("trl sft --model_name_or_path Qwen/Qwen2-VL-2B-Instruct --dataset_name HuggingFaceH4/llava-instruct-"
            "mix-vsft --use_peft --lora_target_modules all-linear --output_dir o")
    s = cmd(line).setup
    assert (s.image_text, s.targets_all_towers, s.tower_adapters, s.causal_lm_class) == (True, True, True, False)
    old = findings(shlex.split(line), {"trl": Version("0.15.2")})
    assert old["vlm-wrong-auto-class"] is None and old["lora-targets-vision-tower"] is None
    assert "vlm-wrong-auto-class" not in findings(shlex.split(line), {"trl": Version("0.16.0")})
    # q_proj / v_proj stay in Qwen2-VL's language model.
    named = cmd(line.replace("all-linear", "q_proj v_proj")).setup
    assert not named.targets_all_towers and not named.tower_adapters


def test_trl_sft_vlm_full_on_zero3_depends_on_text_only_batches():
    line = ("accelerate launch --config_file=examples/accelerate_configs/deepspeed_zero3.yaml "
            "examples/scripts/sft_vlm.py --dataset_name HuggingFaceH4/llava-instruct-mix-vsft "
            "--model_name_or_path llava-hf/llava-1.5-7b-hf --bf16 --torch_dtype bfloat16 --gradient_checkpointing "
            "--output_dir o")
    s = cmd(line).setup
    assert (s.image_text, s.adapter, s.towers_trainable, s.causal_lm_class) == (True, "full", True, False)
    holds = findings(shlex.split(line), {})
    assert holds["zero3-vision-skipped"] == "some micro-batch holds no image (text-only samples mixed in)"


LF_VLM = ("model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\nimage_max_pixels: 262144\nstage: sft\ndo_train: true\n"
          "finetuning_type: {ftype}\nlora_target: all\ndataset: mllm_demo,identity\ntemplate: qwen2_vl\n"
          "cutoff_len: 2048\noutput_dir: saves/x\nbf16: true\n")


def test_llama_factory_freezes_the_vision_tower_by_default(tmp_path):
    path = tmp_path / "qwen2vl_lora_sft.yaml"
    path.write_text(LF_VLM.format(ftype="lora"))
    r = from_files("llama-factory", [str(path)], CURRENT)
    s = r.setup
    assert (s.image_text, s.targets_all_towers, s.tower_adapters, s.towers_trainable) == (True, False, False, False)
    assert "freeze_vision_tower true" in r.sources["targets_all_towers"]
    # The collator adds a blank image to text-only batches from 0.9.2 (commit 2f09c34).
    assert s.image_every_rank and "0.9.2" in r.sources["image_every_rank"]
    assert not from_files("llama-factory", [str(path)], {"llama-factory": Version("0.9.1")}).setup.image_every_rank
    path.write_text(LF_VLM.format(ftype="lora") + "freeze_vision_tower: false\n")
    unfrozen = from_files("llama-factory", [str(path)], CURRENT)
    # From 0.9.0 LLaMA-Factory names the tower's modules by full path and leaves out the patch embedding
    # (model_utils/visual.py patch_target_modules, lora_conflict_keys): adapters land in the tower's Linear layers.
    assert not unfrozen.setup.targets_all_towers and unfrozen.setup.tower_adapters and unfrozen.setup.tower_input_hook
    assert findings(None, {}, "llama-factory", [str(path)])["lora-targets-vision-tower"] == "0.7.1<=llama-factory<0.9.0"
    # train_mm_proj_only (full tuning): only the projector trains, the vision tower and language model stay frozen.
    path.write_text(LF_VLM.format(ftype="full").replace("Qwen/Qwen2-VL-7B-Instruct", "llava-hf/llava-1.5-7b-hf")
                    .replace("qwen2_vl", "llava") + "train_mm_proj_only: true\n")
    proj = from_files("llama-factory", [str(path)], CURRENT)
    assert (proj.setup.towers_trainable, proj.setup.frozen_modules) == (True, True)
    assert "train_mm_proj_only" in proj.sources["towers_trainable"]


def test_llama_factory_full_ddp_with_trainable_tower_needs_the_fake_image(tmp_path):
    path = tmp_path / "qwen2vl_full_sft.yaml"
    path.write_text(LF_VLM.format(ftype="full") + "freeze_vision_tower: false\n")
    line = ["CUDA_VISIBLE_DEVICES=0,1", "llamafactory-cli", "train", str(path)]
    s = from_command(line, CURRENT).setup
    assert (s.engine, s.world_size, s.towers_trainable, s.frozen_modules) == ("ddp", 2, True, True)
    old = findings(line, {"llama-factory": Version("0.9.1")})
    assert old["ddp-unused-vision-tower"] == "some micro-batch holds no image (text-only samples mixed in)"
    assert "ddp-unused-vision-tower" not in findings(line, {"llama-factory": Version("0.9.2")})


MS_SWIFT = ("NPROC_PER_NODE=8 swift sft --model /mnt/models/Qwen2.5VL_3B --dataset tulu.jsonl --torch_dtype bfloat16 "
            "--max_length 8192 ")


def test_ms_swift_unfrozen_vit_under_ddp_on_text_only_data():
    line = MS_SWIFT + "--train_type full --freeze_vit false --freeze_llm false --freeze_aligner false"
    s = cmd(line).setup
    assert (s.image_text, s.engine, s.towers_trainable, s.frozen_modules) == (True, "ddp", True, False)
    holds = findings(shlex.split(line), {})
    assert holds["ddp-unused-vision-tower"] == "some micro-batch holds no image (text-only samples mixed in)"
    # ms-swift >= 3.0 freezes the ViT and the aligner by default: nothing trainable there.
    default = cmd(MS_SWIFT + "--train_type full").setup
    assert (default.towers_trainable, default.frozen_modules) == (False, True)
    assert "ddp-unused-vision-tower" not in findings(shlex.split(MS_SWIFT + "--train_type full"), {})


def test_ms_swift_all_linear_is_matched_per_tower():
    lora = cmd(MS_SWIFT + "--train_type lora --target_modules all-linear --freeze_vit false").setup
    assert (lora.tower_adapters, lora.targets_all_towers, lora.towers_trainable) == (True, False, True)
    named = cmd(MS_SWIFT + "--train_type lora --target_modules qkv proj").setup
    assert named.targets_all_towers and named.tower_adapters


AXOLOTL = ("base_model: Qwen/Qwen2-VL-7B-Instruct\nprocessor_type: AutoProcessor\nchat_template: qwen2_vl\n"
           "datasets:\n  - path: HuggingFaceH4/llava-instruct-mix-vsft\n    type: chat_template\n"
           "adapter: lora\nlora_r: 32\nsequence_len: 8192\nbf16: true\ngradient_checkpointing: true\n")


def test_axolotl_lora_target_linear_reaches_the_vision_tower(tmp_path):
    path = tmp_path / "qwen2vl.yaml"
    path.write_text(AXOLOTL + "lora_target_linear: true\n")
    r = from_files("axolotl", [str(path)], CURRENT)
    assert (r.setup.image_text, r.setup.targets_all_towers, r.setup.tower_adapters) == (True, True, True)
    holds = findings(None, {}, "axolotl", [str(path)])
    assert holds["lora-targets-vision-tower"] is None
    assert holds["reentrant-partial-silent"] == "transformers<5.0.0"
    path.write_text(AXOLOTL + "lora_target_modules: 'model.language_model.layers.[\\d]+.(mlp|self_attn)."
                    "(up|down|gate|q|k|v|o)_proj'\n")
    regex = from_files("axolotl", [str(path)], CURRENT).setup
    assert (regex.image_text, regex.targets_all_towers, regex.tower_adapters) == (True, False, False)


def test_text_only_models_get_no_image_text_unknowns():
    line = ("NPROC_PER_NODE=8 swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type full --dataset d.jsonl")
    r = cmd(line)
    assert not r.setup.image_text and "image_every_rank" not in r.unsure
    doc = json.loads(run_check(shlex.split(line), None, [], {}, as_json=True)[0])
    assert not {u["name"] for u in doc["unknowns"]} & {"image_every_rank", "image_safe_truncation"}


def test_ms_swift_text_model_type_on_an_image_text_checkpoint_loads_a_causal_lm():
    """ms-swift issue 3001 forced Qwen2.5-VL to the text type `qwen2_5` (`swift infer` there; `swift sft` loads the
    same way): AutoModelForCausalLM cannot build a Qwen2_5_VLConfig."""
    line = "swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --model_type {} --train_type lora --dataset d.jsonl"
    forced = cmd(line.format("'qwen2_5'")).setup
    assert forced.image_text and forced.causal_lm_class
    assert findings(shlex.split(line.format("qwen2_5")), CURRENT)["vlm-wrong-auto-class"] is None
    assert not cmd(line.format("qwen2_5_vl")).setup.causal_lm_class  # the model's own type
    assert not cmd(line.replace("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct").format("qwen2_5")
                   ).setup.causal_lm_class  # a text checkpoint of a text type
