"""Runs that load a trained adapter with its base and train nothing: a merge or export (`swift export --merge_lora
true`, `swift merge-lora`, `llamafactory-cli export`), inference and serving (`swift infer`, `swift deploy`).

How such a run is represented. The Combination describes a training run, and its defaults are what a run does when
nobody asked for anything (no checkpointing, one process, no engine, no optimizer sharding, the KV cache on). A
rule about training holds only where a training field leaves its default, so a load run is a Combination whose
training fields keep their defaults: its reader sets only the fields below (what loading and merging decide) and
never reads a training flag, even one the framework accepts on the line or copies from the checkpoint's saved
arguments. `finish` enforces that (a field outside LOAD_FIELDS is a reader's bug), so the rules that can hold on a
load run are exactly those whose knobs are load fields (kbit-merge,
vlm-wrong-auto-class). A field on the Combination saying "this run does not train" would let rules opt out by name,
but every training rule would have to read it; keeping the training fields at their neutral defaults needs no rule
to change.
"""

from __future__ import annotations

from loraflow.frontends.common import Draft

# What loading the base (and merging the adapter into it) decides; every other field keeps its default.
LOAD_FIELDS = frozenset({
    "adapter", "quantization", "quant_storage_matches", "merge_into_quantized", "ptq_checkpoint", "image_text",
    "causal_lm_class", "image_safe_truncation", "fp16_overflows", "vlm_renamed", "model_type", "world_size"})


def finish(draft: Draft, run: str) -> None:
    """Close the draft of a load run named `run` (`swift export --merge_lora true`): what it reads, that it trains
    nothing, and no training field set."""
    draft.note(f"{run} loads the base with the trained adapter and trains nothing: only what loading and merging "
               "decide is read; training settings (checkpointing, engines, optimizer) do not apply")
    draft.set("world_size", 1, f"{run}: a load or merge, one process (no gradient synchronisation)")
    if draft.get("image_text"):
        # The length limit that can cut an image's placeholder tokens is a training sample's; none is built here.
        draft.settle("image_safe_truncation", True, f"{run}: no training sample is built or truncated")
    for name in [n for n in draft.unsure if n not in LOAD_FIELDS]:
        del draft.unsure[name]
    stray = sorted(set(draft.values) - LOAD_FIELDS)
    if stray:  # pragma: no cover - a reader that set a training field on a load run
        raise RuntimeError(f"a load run set training fields {', '.join(stray)}; a load reader sets only "
                           f"{', '.join(sorted(LOAD_FIELDS))}")
