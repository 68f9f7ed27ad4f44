"""Liger's fused linear cross entropy beside an adapter on the output head (rule liger-head-adapter-bypassed).
Liger computes the training loss from `lm_head.weight` without calling lm_head (liger_kernel/transformers/model/
*.py lce_forward, every release to 0.8.5), and a PEFT layer's `.weight` is its frozen base weight
(tuners_utils.BaseTunerLayer.weight): a LoRA or DoRA on lm_head gets no gradient. Where each framework turns the
fused loss on, and where it refuses the pair instead, read from their wheels (trl 0.12 - 1.16, transformers 4.44 -
5.23, LLaMA-Factory's and ms-swift's trainers)."""

from __future__ import annotations

import json

from loraflow.frontends.common import Draft, as_bool, as_list, at_least

HEAD_NAMES = ("lm_head",)
"""What a target list must name to put an adapter on the output head; PEFT's all-linear leaves it out
(tuners_utils.py _maybe_include_all_linear_layers)."""


def head_adapter(draft: Draft, targets, source: str) -> None:
    names = [str(t).strip().split(".")[-1] for t in as_list(targets)]
    if draft.get("adapter") != "full" and any(n in HEAD_NAMES for n in names):
        draft.set("head_adapter", True, f"{source} names lm_head (an adapter layer on the output head)")


def fused(draft: Draft, source: str, why: str = "") -> None:
    draft.set("liger_fused_ce", True, f"{source}: Liger's fused linear cross entropy reads lm_head.weight"
              + (f" ({why})" if why else ""))


def _turned_off(options: dict[str, tuple]) -> bool:
    """liger_kernel_config={"fused_linear_cross_entropy": false} (TrainingArguments, transformers >= 4.52)."""
    config = options.get("liger_kernel_config", (None, ""))[0]
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return False
    return isinstance(config, dict) and config.get("fused_linear_cross_entropy") is False


def trl(draft: Draft, trainer: str, options: dict[str, tuple], is_trl: bool) -> None:
    """TRL / the HF Trainer. SFT and a plain Trainer: `use_liger_kernel` (TrainingArguments, transformers >= 4.45;
    a PeftModel is patched from 4.49, PR #35680) fuses the loss in the forward that gets the labels. GRPO and DPO
    compute log-probs without labels, so a patched forward calls lm_head: their fused loss is their own
    `use_liger_loss` (GRPO 0.17 - 0.24, DPO from 0.19), `use_liger_kernel` in GRPO from 0.25. TRL refuses the
    pair itself in GRPO 0.17 (any PEFT model) and from 1.7.0 (PR #5977), DPO from 0.29.0, SFT from 1.15.0."""
    from loraflow.frontends.trl import since

    if not draft.get("head_adapter") or _turned_off(options):
        return
    rl = is_trl and trainer in ("grpo", "dpo")
    key = ("use_liger_loss" if "use_liger_loss" in options else
           "use_liger_kernel" if "use_liger_kernel" in options and (not rl or (trainer == "grpo" and since(
               draft, "0.25.0"))) else None)
    if key is None or not as_bool(options[key][0], options[key][1]):
        return
    where = options[key][1]
    if rl and trainer == "grpo":
        refused = (since(draft, "0.17.0") and not since(draft, "0.18.0")) or since(draft, "1.7.0")
    elif rl:
        refused = since(draft, "0.29.0")
    else:
        if not at_least(draft, "transformers", "4.49.0"):
            draft.note(f"{where}: transformers < 4.49 applies no Liger kernel to a PEFT model (\"No liger kernels "
                       "will be applied\")")
            return
        refused = is_trl and since(draft, "1.15.0")
    if refused:
        draft.stop(f"{where} with an adapter on lm_head: TRL refuses Liger's fused loss on this PEFT model (it would "
                   "read lm_head's frozen base weight); put lm_head in modules_to_save or drop it from the targets")
    else:
        fused(draft, where)
