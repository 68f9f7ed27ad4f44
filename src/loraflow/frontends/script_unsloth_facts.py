"""What Unsloth's get_peft_model does to the adapter options a script passes it, read into the options hf.py reads
(script_facts.py calls it; script_unsloth.py has what Unsloth's patched trainers do at run time)."""

from __future__ import annotations

from loraflow.frontends.hf_options import Opt


def unsloth_full_modules(opts: dict[str, Opt]) -> None:
    """embed_tokens / lm_head among Unsloth's target_modules: get_peft_model moves them to modules_to_save (trained
    in full, in float32; unsloth/models/llama.py), as the continued-pretraining notebooks rely on
    (unslothai/notebooks python_scripts/Mistral_v0.3_(7B)-CPT.py)."""
    targets = opts.get("lora_target_modules")
    if targets is None or not isinstance(targets.value, list):
        return
    full = [t for t in targets.value if t in ("embed_tokens", "lm_head")]
    if not full:
        return
    saved = opts.get("lora_modules_to_save")
    kept = list(saved.value) if saved is not None and isinstance(saved.value, list) else []
    opts["lora_target_modules"] = Opt([t for t in targets.value if t not in full], targets.source, True)
    opts["lora_modules_to_save"] = Opt(kept + [t for t in full if t not in kept], targets.source + (
        " (Unsloth trains embed_tokens / lm_head in full: modules_to_save)"), True)
