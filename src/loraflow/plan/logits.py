"""The logits area: where the output head runs (losses/logprobs.py): at the learned positions only, in chunks or in one
block, or at every position."""

from __future__ import annotations

from loraflow.errors import ConfigError
from loraflow.losses.logprobs import FULL, HeadMode, chunk_tokens
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.rules import Combination


def head_chunks_gather(setup: Combination) -> bool:
    """A trainable head (an adapter on it, or trained in full) is PEFT's wrapper around sub-modules, and ZeRO-3
    gathers a sub-module's weights at each call: one call per chunk, and the chunks per rank follow its own learned
    tokens, so ranks would gather different numbers of times and the collectives would no longer match."""
    return setup.zero3 and setup.lm_head_trainable


def decide_logits(ctx: Context) -> tuple[HeadMode, Decision]:
    """Head at learned positions only unless asked otherwise or the model needs its full logits. One block instead
    of chunks for a trainable head under ZeRO-3 (`head_chunks_gather`)."""
    config, info, head = ctx.config, ctx.model, ctx.spec.head
    asked = config.train.logits
    if asked == "learned" and info.logit_transform:
        raise ConfigError([f"train.logits=learned: this {info.model_type} model applies {info.logit_transform} to "
                           "its logits after the head, which log-probs taken inside the head would skip; set "
                           "train.logits=auto (or full)."])
    if head == "score" or asked == "full" or (asked == "auto" and info.logit_transform):
        mode = FULL
    elif head_chunks_gather(ctx.setup):
        mode = HeadMode(selected=True, chunk_tokens=0)
    else:
        mode = HeadMode(selected=True, chunk_tokens=chunk_tokens(info.vocab_size, config.train.logits_chunk_mib))
    return mode, _decision(ctx, mode)


def _decision(ctx: Context, mode: HeadMode) -> Decision:
    t = ctx.config.train
    if ctx.spec.head == "score":
        return Decision("logits", "none (a score head)", "the reward model's head gives one score per row; the "
                        "vocabulary head is not used")
    if not mode.selected:
        why = (f"this model applies {ctx.model.logit_transform} after its head" if t.logits == "auto"
               else "train.logits=full")
        return Decision("logits", "every position (full [tokens x vocabulary] logits)", why)
    if mode.chunk_tokens:
        chunks = (f"in chunks of {mode.chunk_tokens} positions ({t.logits_chunk_mib:g} MiB of float32 logits, "
                  "train.logits_chunk_mib)")
    elif t.logits_chunk_mib:
        chunks = ("all at once: the head trains under ZeRO-3, which gathers its sub-modules at every call, and "
                  "each rank's chunks follow its own tokens, so chunked calls would unbalance the collectives")
    else:
        chunks = "all at once (train.logits_chunk_mib=0)"
    return Decision("logits", f"learned positions only, {chunks}",
                    "only positions whose next token is learned carry loss: the head skips the others, and "
                    "[tokens x vocabulary] logits are never held whole")
