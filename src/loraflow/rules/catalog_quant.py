"""The rules of quantized bases (QLoRA: bitsandbytes 4-bit and 8-bit weights under adapters). The storage-dtype rule
of sharded 4-bit weights is with the other sharding rules (catalog_sharded.py: qlora-storage-dtype)."""

from __future__ import annotations

from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import Evidence, LogSigns, Message

register(Rule(
    id="kbit-cpu-repack",
    title="bitsandbytes repacks 4-bit weights in place for its CPU kernel at evaluation",
    verdict="fix",
    impact="crash",
    conditions="a 4-bit base on a CPU with AVX512-BF16, a layer run in eval mode without autograd (evaluation, "
               "generation, reference scoring)",
    knobs=("quant_cpu_repack",),
    when=lambda s: s.quantization == "4bit" and s.cpu and s.quant_cpu_repack,
    cause=("bitsandbytes 0.50 converts a Linear4bit weight to a CPU-kernel layout the first time the layer runs "
           "in eval mode on an input that does not require grad: it reorders the packed weight and turns the "
           "absmax scales into bfloat16, in place. The frozen base the adapters train on changes after the first "
           "evaluation (its scales are rounded), and a layer whose input width is not a multiple of the 64-weight "
           "block fails to convert."),
    fix="loraflow turns the conversion off on every 4-bit layer (support_avx512bf16_for_cpu=False).",
    remedy=lambda s: {"quant_cpu_repack": False},
    elsewhere="set `module.support_avx512bf16_for_cpu = False` on every bitsandbytes Linear4bit after loading",
    references=("https://github.com/bitsandbytes-foundation/bitsandbytes/blob/main/bitsandbytes/nn/modules.py "
                "(Linear4bit.forward, _convert_weight_packed_for_cpu)",),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"shape '\[\d+, \d+\]' is invalid for input of size \d+", "shared",
                          "bitsandbytes functional.py: _convert_weight_packed_for_cpu", "bitsandbytes 0.50.2 (seen)"),),
        frames=(Message(r"functional\.py:_convert_weight_packed_for_cpu$", "own"),),
        evidence=(Evidence("quant4bit", 3, "a 4-bit base is in use"),),
        prior=1.0,
        tells_apart="the traceback passes through bitsandbytes' _convert_weight_packed_for_cpu, from Linear4bit's "
                    "forward in eval mode on the CPU"),
))

register(Rule(
    id="kbit-full-finetune",
    title="A quantized base trained without adapters",
    verdict="error",
    impact="crash",
    conditions="bitsandbytes 4-bit or 8-bit base with full fine-tuning (no adapters)",
    knobs=("adapter", "quantization"),
    when=lambda s: s.quantization is not None and s.adapter == "full",
    cause=("Quantized weights are integer codes with scales: there is no float weight for an optimizer to update, "
           "so a quantized base can only be trained through adapters (or modules kept unquantized)."),
    fix="Set adapter.method=lora (or dora) to train adapters on the quantized base, or model.quantization.method=none "
        "for full fine-tuning.",
    elsewhere="attach LoRA adapters with peft (get_peft_model) before training, or load the model unquantized",
    references=("https://github.com/huggingface/transformers/blob/main/src/transformers/trainer_utils.py "
                "(validate_quantization_for_training)",),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"cannot perform fine-tuning on purely quantized models", "own",
                          "transformers Trainer: validate_quantization_for_training"),),
        evidence=(Evidence("quant4bit", 2, "a 4-bit base is in use"),),
        prior=1.0,
        tells_apart="transformers' Trainer refuses a quantized model without trainable adapters"),
))
