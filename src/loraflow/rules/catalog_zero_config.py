"""The rules of what DeepSpeed ZeRO-3 is handed beyond the model's own layers: a config value left "auto" that one
release of the filler (transformers' HfDeepSpeedConfig, accelerate's prepare) writes in a form another release of
DeepSpeed's validation refuses, and mixture-of-experts blocks whose experts it must gather in the same order on
every rank."""

from __future__ import annotations

from loraflow.rules.rule import Rule, older, register
from loraflow.rules.signs import Evidence, LogSigns, Message

DEEPSPEED_PYDANTIC_V2 = "0.15.0"
"""deepspeed/runtime/config_utils.py validates with pydantic 2 from here (0.14.4: deepspeed.pydantic_v1, which
truncated a float to the int field; PR #5167)."""
TRANSFORMERS_FILLS_INT = "4.45.0"
"""transformers integrations/deepspeed.py fills int(0.9 * hidden_size**2) from here (PR #33402; 4.44.2 a float)."""
ACCELERATE_FILLS_INT = "0.31.0"
"""accelerate accelerator.py _prepare_deepspeed fills int(...) from here (PR #2814; 0.30.1 a float)."""


def _filled_as_fraction(s) -> bool:
    """The prefetch bucket reaches DeepSpeed with a fractional part: written so, or "auto" filled by a release that
    wrote 0.9 * hidden_size**2 as a float (the HF Trainer's transformers, or a loop's own accelerate)."""
    if s.zero3_prefetch_bucket == "fraction":
        return True
    if s.zero3_prefetch_bucket != "auto":
        return False
    if s.accumulation_loop == "hf-trainer":
        return older(s, "transformers", TRANSFORMERS_FILLS_INT)
    return s.accumulation_loop == "accelerate" and older(s, "accelerate", ACCELERATE_FILLS_INT)


register(Rule(
    id="zero3-prefetch-bucket-float",
    title="ZeRO-3's prefetch bucket size reaches DeepSpeed as a fraction, which its config validation refuses",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed >= 0.15.0 at ZeRO stage 3 with stage3_prefetch_bucket_size \"auto\" filled by the HF "
               "Trainer of transformers < 4.45.0 (LLaMA-Factory's and ms-swift's shipped ZeRO-3 files) or by "
               "accelerate < 0.31.0, or written as a number with a fractional part",
    knobs=("zero3_prefetch_bucket",),
    affected={"deepspeed": f">={DEEPSPEED_PYDANTIC_V2}"},
    boundaries={"transformers": (TRANSFORMERS_FILLS_INT,), "accelerate": (ACCELERATE_FILLS_INT,)},
    when=lambda s: s.zero3 and _filled_as_fraction(s),
    cause=("transformers (before 4.45) and accelerate (before 0.31) fill an \"auto\" stage3_prefetch_bucket_size with "
           "0.9 x hidden_size**2 as a Python float (15099494.4 for a hidden size of 4096; a whole number only when "
           "the hidden size is a multiple of 10). DeepSpeed validated its config with pydantic 1, which truncated "
           "it, until 0.15.0; from 0.15.0 pydantic 2 refuses a float with a fractional part for the integer field, "
           "so deepspeed.initialize (or zero.Init at load) stops: `Input should be a valid integer, got a number "
           "with a fractional part [type=int_from_float`."),
    fix="loraflow writes its DeepSpeed config with whole numbers.",
    remedy=lambda s: {"zero3_prefetch_bucket": None},
    elsewhere="upgrade transformers to 4.45.0 or later (accelerate to 0.31.0 for a loop of your own), or write an "
              "integer for stage3_prefetch_bucket_size in the DeepSpeed JSON (e.g. 15099494), or pin deepspeed<0.15.0",
    references=("https://github.com/deepspeedai/DeepSpeed/issues/6525",
                "https://github.com/OpenBMB/MiniCPM-V/issues/694",
                "https://github.com/hiyouga/LlamaFactory/issues/5586", "https://github.com/THUDM/LongWriter/issues/16",
                "https://github.com/hiyouga/LlamaFactory/issues/5795", "https://github.com/hustvl/Senna/issues/14",
                "https://github.com/hiyouga/LlamaFactory/issues/5252",
                "https://github.com/huggingface/transformers/pull/33402",
                "https://github.com/huggingface/accelerate/pull/2814"),
    fixed_in="transformers 4.45.0 (HF Trainer), accelerate 0.31.0",
    log=LogSigns(
        # pydantic prints the field name on the line before its message, which any model's int field can print.
        messages=(Message(r"Input should be a valid integer, got a number with a fractional part "
                          r"\[type=int_from_float", "shared",
                          "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (pydantic 2, deepspeed >= 0.15.0)"),),
        evidence=(Evidence("zero3_bucket_check", 6, "DeepSpeed's ZeRO config validation names the prefetch bucket",
                           decisive=True),
                  Evidence("deepspeed", 1, "DeepSpeed is in use")),
        prior=1.0,
        tells_apart="DeepSpeed's pydantic validation names stage3_prefetch_bucket_size and a float input_value"),
))


register(Rule(
    id="moe-zero3-expert-hang",
    title="ZeRO-3 ranks wait for experts that other ranks' tokens never reached",
    verdict="error",
    impact="crash",
    conditions="ZeRO-3 on several processes with a sparse mixture-of-experts model whose block calls only the "
               "experts its tokens reach (Mixtral, Qwen2-MoE and Qwen3-MoE in transformers 4.52/4.53 - 4.57, the "
               "DeepSeek, GLM-4.5, Phi-3.5-MoE and Jamba blocks before 5.0), the block not registered as a ZeRO-3 "
               "leaf module (the HF Trainer and TRL never do; the frameworks that do, from which release and for "
               "which models, are in docs/mitigations.md)",
    knobs=("moe_leaf_registered",),
    when=lambda s: s.zero3 and s.world_size > 1 and s.moe_skips_experts and not s.moe_leaf_registered,
    cause=("ZeRO-3 gathers each module's partitioned weights in its forward hook, a collective every rank must enter "
           "in the same order. A block that skips the experts no token of this micro-batch was routed to runs "
           "different experts on different ranks, so one rank waits in an all-gather (or, in backward, a "
           "reduce-scatter) for an expert another rank never called: the step hangs at 100% GPU until NCCL's "
           "watchdog times out (`Watchdog caught collective operation timeout: WorkNCCL(... OpType=_ALLGATHER_BASE`). "
           "LoRA or full fine-tuning alike: the frozen experts are gathered too."),
    fix="loraflow requires transformers 5, whose blocks hold every expert in one module that ZeRO-3 gathers "
        "whole whatever the routing.",
    elsewhere="register the block as a ZeRO-3 leaf before deepspeed.initialize (deepspeed.utils."
              "set_z3_leaf_modules(model, [MixtralSparseMoeBlock]), deepspeed >= 0.13), use a framework release "
              "that does, or a transformers release whose block runs every expert (Qwen3-MoE: 4.51.3, "
              "ms-swift#5875; 5.0 and later)",
    references=("https://github.com/deepspeedai/DeepSpeed/issues/7461",
                "https://github.com/modelscope/ms-swift/issues/5875",
                "https://github.com/modelscope/ms-swift/issues/5400",
                "https://github.com/hiyouga/LlamaFactory/issues/2315",
                "https://github.com/hiyouga/LlamaFactory/issues/1931",
                "https://github.com/hiyouga/LlamaFactory/issues/9222",
                "https://github.com/OpenGVLab/InternVL/issues/1193",
                "https://github.com/deepspeedai/DeepSpeed/issues/5066",
                "https://github.com/deepspeedai/DeepSpeed/issues/5502",
                "https://github.com/deepspeedai/DeepSpeed/pull/4966"),
    fixed_in="not fixed in DeepSpeed (leaf modules are the mechanism, 0.13.0); transformers 5.0 stacks the experts",
    log=LogSigns(
        messages=(Message(r"Watchdog caught collective operation timeout|collective operation timeout", "generic",
                          "torch ProcessGroupNCCL watchdog"),),
        evidence=(Evidence("moe", 4, "a mixture-of-experts model is trained", decisive=True),
                  Evidence("zero3", 3, "ZeRO-3 is in use"),
                  Evidence("allgather_timeout", 1, "an all-gather is involved"),
                  Evidence("vision", -2, "a vision tower skipped on some ranks hangs alike (zero3-vision-skipped)")),
        prior=0.5,
        tells_apart="a mixture-of-experts model under ZeRO-3 whose run stalls in a parameter all-gather"),
))
