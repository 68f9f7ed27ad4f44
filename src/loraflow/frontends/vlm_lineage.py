"""Image-text fine-tuning scripts that many users copy into their own repos, read when the script itself is not here
(a launch script that names `src/train/train_sft.py` from elsewhere): what their code fixes about checkpointing,
which no flag shows. Without it, `check` asks whether the script hooks the embeddings, though every copy of these
scripts answers the same way.

- 2U1's VLM fine-tuning repos (Qwen2-VL-Finetune / Qwen-VL-Series-Finetune, Phi3-Vision-Finetune, Gemma3-Finetune,
  Llama3.2-Vision-Finetune, Molmo-Finetune, Pixtral-Finetune) and their forks: `src/train/train_sft.py` (older:
  `src/training/train.py`) with `--lora_namespan_exclude` / `--freeze_llm`. Under `--gradient_checkpointing` every
  release calls `model.enable_input_require_grads()` (2U1/Qwen-VL-Series-Finetune src/train/train_sft.py); the
  use_reentrant it passes changed between releases, so that stays a question.
- InternVL's `internvl_chat/internvl/train/internvl_chat_finetune.py` (and the GRPO/MPO variants users add beside
  it): `--use_backbone_lora N` wraps the ViT with PEFT (modeling_internvl_chat.py wrap_backbone_lora), which hooks
  nothing; only wrap_llm_lora calls enable_input_require_grads, on the language model. The script turns the ViT's
  checkpointing on (`model.vision_model.encoder.gradient_checkpointing = True`), and InternViT's encoder calls
  `torch.utils.checkpoint.checkpoint(encoder_layer, hidden_states)` without use_reentrant (OpenGVLab/InternVL
  internvl_chat/internvl/model/internvl_chat/modeling_intern_vit.py, InternVisionEncoder.forward; torch still
  takes the reentrant path when it is not passed, torch/utils/checkpoint.py in 2.13): reentrant, fed by a frozen
  patch embedding, so the ViT's adapters get no gradient while the language model's train.
- InternLM-XComposer's `finetune/finetune.py` (XComposer, XComposer2, 2.5; copied into users' repos beside its
  `finetune_lora.sh`), told by `--fix_vit` with `--fix_sampler` / `--img_size` / `--hd_num`: with `--use_lora` and
  `--gradient_checkpointing` it calls `model.enable_input_require_grads()` after get_peft_model
  (InternLM/InternLM-XComposer finetune/finetune.py); it passes no gradient_checkpointing_kwargs.
"""

from __future__ import annotations

import re
from typing import Any

from loraflow.frontends.common import Draft

_QWEN_VL_FINETUNE = re.compile(r"(?:^|/)src/train(?:ing)?/train(?:_sft|_dpo|_grpo|_cls)?\.py$")
"""2U1's entry points; the flags below tell them from other `src/train/train.py` scripts."""
_QWEN_VL_FLAGS = ("lora_namespan_exclude", "freeze_llm", "num_lora_modules")
_INTERNVL = re.compile(r"(?:^|/)internvl/train/internvl_chat_\w+\.py$")
_XCOMPOSER = re.compile(r"(?:^|/)finetune\.py$")
_XCOMPOSER_FLAGS = ("fix_sampler", "img_size", "hd_num")
_XCOMPOSER_CODE = "InternLM/InternLM-XComposer finetune/finetune.py"
_QWEN_VL_CODE = "2U1 Qwen-VL-Series-Finetune lineage src/train/train_sft.py"
_INTERNVL_CODE = "InternVL internvl_chat/internvl/train/internvl_chat_finetune.py"


def _rank(opts: dict[str, Any], name: str) -> int:
    """InternVL's `--use_backbone_lora 16` / `--use_llm_lora 16`: a LoRA rank, 0 (the default) for none."""
    opt = opts.get(name)
    try:
        return int(str(opt.value)) if opt is not None and opt.value is not None else 0
    except ValueError:
        return 0


def apply(draft: Draft, program: str, opts: dict[str, Any]) -> None:
    """Checkpointing facts of a known image-text script that is not here; call once checkpointing is on."""
    path = program.replace("\\", "/")
    if _QWEN_VL_FINETUNE.search(path) and any(n in opts for n in _QWEN_VL_FLAGS):
        # Its reentrancy changed with the releases (use_reentrant False in 2024, True from commit 1e34033, False
        # again with --vision_lora after issue #193), so that question stays; the hook never changed.
        if draft.get("adapter") != "full":
            draft.settle("input_grad_hook", True, f"{program} ({_QWEN_VL_CODE}: --gradient_checkpointing calls "
                         "model.enable_input_require_grads())")
    elif _XCOMPOSER.search(path) and "fix_vit" in opts and any(n in opts for n in _XCOMPOSER_FLAGS):
        if draft.get("adapter") != "full":
            draft.settle("input_grad_hook", True, f"{program} ({_XCOMPOSER_CODE}: --use_lora with "
                         "--gradient_checkpointing calls model.enable_input_require_grads())")
    elif _INTERNVL.search(path) and _rank(opts, "use_backbone_lora") > 0:
        source = opts["use_backbone_lora"].source
        draft.settle("reentrant", True, f"{source} ({_INTERNVL_CODE} turns the ViT's checkpointing on; InternViT's "
                     "encoder calls torch.utils.checkpoint.checkpoint without use_reentrant, so reentrant)")
        draft.settle("tower_input_hook", False, f"{source} ({_INTERNVL_CODE}: wrap_backbone_lora hooks nothing; "
                     "only wrap_llm_lora calls enable_input_require_grads, on the language model)")
        if _rank(opts, "use_llm_lora") > 0:
            draft.settle("input_grad_hook", True, f"{opts['use_llm_lora'].source} ({_INTERNVL_CODE}: wrap_llm_lora "
                         "calls language_model.enable_input_require_grads())")
