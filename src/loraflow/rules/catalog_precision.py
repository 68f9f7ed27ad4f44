"""The rules of number formats: a model whose activations overflow float16, adapters whose dtype differs from the
activations they multiply outside autocast, and what FlashAttention refuses (float32 inputs, a right-padded batch
with the KV cache on). (Pure bf16 and fp16 storage of trained
weights are in catalog.py: bf16-lost-updates, fp16-trainable-unscale; DeepSpeed's bf16 master weights in
catalog_sharded.py.)"""

from __future__ import annotations

from packaging.version import Version

from loraflow.rules.combination import Combination
from loraflow.rules.rule import Rule, older, register
from loraflow.rules.signs import Evidence, LogSigns, Message


register(Rule(
    id="fp16-overflow",
    title="A model whose activations overflow float16 trained in fp16",
    verdict="error",
    impact="silent",
    conditions="fp16 training (float16 autocast, or weights stored in float16) of a model family whose activations "
               "or gradients exceed float16's range: T5 (t5, mt5, flan-t5, ul2), Gemma 3 / 3n / 4, gpt-oss, Qwen3.5, "
               "Qwen3-MoE, GLM-4 MoE (families.FP16_OVERFLOW)",
    knobs=("precision",),
    when=lambda s: s.fp16_overflows and s.precision in ("fp16", "fp16-mixed"),
    cause=("float16 holds values up to 65504; these families were pretrained in bfloat16 and their hidden states or "
           "backward gradients grow past that, so a layer's output or a gradient turns to inf and then NaN. A dynamic "
           "loss scaler reads every such step as an overflow: it skips the update and halves the scale, so the run "
           "learns nothing while the loss looks steady (the HF Trainer), or DeepSpeed stops once the scale reaches "
           "its floor; sampling from such a model fails on inf/NaN probabilities."),
    fix="Set precision.mode=bf16-mixed (bfloat16 has float32's range); on a GPU without bfloat16 (T4, V100) train "
        "in precision.mode=fp32.",
    elsewhere="bf16=True instead of fp16=True (DeepSpeed: \"bf16\": {\"enabled\": true}, Lightning precision "
              "bf16-mixed); on a GPU without bfloat16, fp32 (Lightning 32-true)",
    references=("https://github.com/google-research/text-to-text-transfer-transformer/issues/539",
                "https://github.com/huggingface/transformers/issues/36822",
                "https://github.com/unslothai/unsloth-zoo/pull/866",
                "https://github.com/unslothai/unsloth/blob/main/unsloth/models/loader.py (FORCE_FLOAT32)",
                "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/fp16/loss_scaler.py "
                "(DynamicLossScaler.update_scale)",
                "https://github.com/deepspeedai/DeepSpeedExamples/issues/418",
                "https://github.com/Lightning-AI/litgpt/issues/693"),
    fixed_in="not a bug: float16's range",
    log=LogSigns(
        messages=(Message(r"Current loss scale already at minimum - cannot decrease scale anymore", "own",
                          "deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale (every step "
                          "overflowed down to min_loss_scale)"),
                  # A scale of 8 or less: ~13 halvings from the usual 2**16 start, far below where a healthy fp16 run
                  # settles; the first steps' overflow messages at large scales are normal calibration.
                  Message(r"(Attempted loss scale: |Reducing dynamic loss scale from )(0\.\d+|[1248])(\.0)?,? "
                          r"(reducing )?to\b", "warning",
                          "deepspeed fused_optimizer / loss_scaler: the dynamic loss scale fell to 8 or below"),
                  Message(r"probability tensor contains either `?inf`?, `?nan`? or element < 0", "generic",
                          "torch.multinomial in generate()'s sampling, on logits that overflowed"),
                  # NaN losses or gradients: many causes print them; only with float16 or a family that overflows
                  # it in the log do they point here.
                  Message(r"NaN gradient detected|'(loss|grad_norm)': nan\b|\b(loss|grad[-_ ]norm)( is|:|=) ?nan\b",
                          "generic", "the training loop's loss / gradient-norm report, or a NaN-gradient hook")),
        evidence=(Evidence("fp16", 3, "float16 is in use"),
                  Evidence("fp16_on", 1, "float16 is switched on", decisive=True),
                  Evidence("fp16_overflow_family", 2, "a family whose activations overflow float16 is in use",
                           decisive=True),
                  Evidence("bf16_on", -6, "bfloat16 is switched on: float16's range is not what runs",
                           excludes=True),
                  Evidence("fp16_off", -4, "float16 is switched off"),
                  Evidence("grad_scaler", 1, "a loss scaler is in use")),
        prior=1.0,
        tells_apart="DeepSpeed's loss scale at its floor, or falling to single digits, in an fp16 run: every step "
                    "overflows, which a model pretrained in bfloat16 does in float16"),
))


def _dtype_mismatch(s: Combination) -> bool:
    """Which PEFT release still lets the adapter's dtype and its input's differ, by what the base is."""
    if s.adapter == "full":
        return False
    if s.quantization == "4bit":
        return older(s, "peft", "0.4.0")
    if s.quantization == "8bit":
        # DeepSpeed's fp16/bf16 casts the whole module, adapters included, to half; a pure half run stores them so.
        half_adapters = s.precision in ("fp16", "bf16") or (s.engine_spec.zero and s.half_precision)
        return half_adapters and older(s, "peft", "0.6.0")
    return s.mixed_param_dtypes and s.precision in ("fp16", "bf16") and older(s, "peft", "0.3.0")


register(Rule(
    id="lora-dtype-mismatch",
    title="LoRA weights multiply activations of another dtype outside autocast",
    verdict="error",
    impact="crash",
    conditions="LoRA without autocast on a base whose activations are in another dtype than the adapters, in a PEFT "
               "release that does not cast between them: a bitsandbytes 8-bit base with half-precision adapters "
               "(DeepSpeed fp16/bf16, a pure half run), peft < 0.6.0; a 4-bit base, peft < 0.4.0 (no 4-bit LoRA "
               "layer); a half-precision base with float32 adapters, peft < 0.3.0",
    knobs=("precision", "quantization"),
    affected={"peft": "<0.6.0"},
    boundaries={"peft": ("0.3.0", "0.4.0")},
    when=_dtype_mismatch,
    cause=("Outside autocast a matmul needs both operands in one dtype, and PEFT's LoRA layers did not always cast "
           "their input to the adapter's dtype: before 0.3.0 a LoRA Linear fed its float32 adapters the half "
           "activations as they came; until 0.6.0 the 8-bit layer cast its input to float32 whatever the adapters "
           "were, and DeepSpeed's fp16/bf16 had cast them to half; before 0.4.0 PEFT had no 4-bit layer and wrapped "
           "a bitsandbytes Linear4bit as a plain Linear, multiplying by its packed uint8 weight."),
    fix="Upgrade peft to 0.6.0 or later: each LoRA layer then casts its input to the adapter's dtype and its output "
        "back. Else train under autocast (mixed precision) with float32 adapters.",
    elsewhere="pip install 'peft>=0.6.0'; else fp16=True / bf16=True as mixed precision (autocast) rather than a "
              "model cast to half",
    references=("https://github.com/huggingface/peft/pull/874",
                "https://github.com/huggingface/peft/blob/v0.3.0/src/peft/tuners/lora.py (Linear.forward casts x "
                "to lora_A's dtype; v0.2.0 does not)",
                "https://github.com/huggingface/peft/issues/175", "https://github.com/huggingface/peft/issues/88",
                "https://github.com/hiyouga/LlamaFactory/issues/515",
                "https://github.com/hiyouga/LlamaFactory/issues/13"),
    fixed_in="peft 0.6.0 (8-bit), 0.4.0 (4-bit), 0.3.0 (half base)",
    log=LogSigns(
        messages=(Message(r"expected scalar type (Half|Float|BFloat16) but found (Half|Float|BFloat16)", "generic",
                          "torch addmm/linear on a half input and float32 weight (torch < 2.1 wording)"),
                  Message(r"expected mat1 and mat2 to have the same dtype|mat1 and mat2 must have the same dtype",
                          "generic", "torch addmm/mm"),
                  Message(r"self and mat2 must have the same dtype", "generic", "torch mm")),
        frames=(Message(r"peft[/\\.]tuners[/\\.](lora(\.py|[/\\.]layer\.py|[/\\.]bnb\.py)):forward$", "shared"),),
        evidence=(Evidence("quant4bit", 3, "a bitsandbytes-quantized base is in use (its LoRA layer's casts are "
                                           "release-dependent)"),
                  # The 8-bit case of the conditions: peft < 0.6.0's Linear8bitLt.forward cast x to float32 for
                  # adapters DeepSpeed had cast to half (peft/tuners/lora.py, v0.5.0).
                  Evidence("quant8bit", 3, "an 8-bit (LLM.int8) base is in use: before peft 0.6.0 its LoRA layer "
                                           "fed the adapters float32 whatever their dtype"),
                  Evidence("deepspeed", 1, "DeepSpeed casts the whole module, adapters included, to half")),
        prior=0.5,
        tells_apart="a dtype mismatch raised inside a LoRA layer's forward on a quantized base, with a PEFT release "
                    "before 0.6.0"),
))


register(Rule(
    id="flash-attn-fp32-inputs",
    title="FlashAttention receives float32 inputs, which its kernels refuse",
    verdict="error",
    impact="crash",
    conditions="attn_implementation flash_attention_2 (or use_flash_attention_2) on float32 weights (loaded without "
               "a dtype before transformers 5, or as float32, a k-bit model's too) with no bf16/fp16 mixed precision; "
               "Unsloth's, remote-code and patched attention are named by explain from the kernel's refusal",
    knobs=("flash_attn_fp32",),
    when=lambda s: s.flash_attn_fp32,
    cause=("The flash-attn kernels take only float16 and bfloat16. transformers casts float32 queries to the "
           "autocast dtype, else to a quantized model's compute dtype, else to q_proj's own weight dtype: with "
           "float32 weights and no mixed precision that is float32 again, and the kernel refuses "
           "(`FlashAttention only support fp16 and bf16 data type`). transformers < 4.37 refused an explicit "
           "float32 dtype at load instead; custom attention code (Unsloth's, remote-code models, flash-attn patches) "
           "casts nothing at all."),
    fix="loraflow refuses model.attn_implementation flash_attention_2 with float32 weights and precision fp32 "
        "before the first step: set precision.mode bf16-mixed, or model.dtype bfloat16.",
    elsewhere="pass --bf16 (or --fp16) to the trainer, or load the model with torch_dtype=torch.bfloat16 "
              "(\"auto\" on a half-precision checkpoint), or use attn_implementation sdpa",
    references=("https://github.com/unslothai/unsloth/issues/827", "https://github.com/QwenLM/Qwen3/issues/406",
                "https://github.com/microsoft/PhiCookBook/issues/127",
                "https://github.com/yangjianxin1/Firefly/issues/259",
                "https://github.com/artidoro/qlora/issues/221", "https://github.com/unslothai/unsloth/issues/933",
                "https://github.com/huggingface/transformers/issues/26066"),
    fixed_in="by design (the kernels are half precision only)",
    log=LogSigns(
        messages=(Message(r"FlashAttention only supports? fp16 and bf16 data types?", "own",
                          "flash-attn csrc flash_api.cpp mha_fwd (TORCH_CHECK on q's dtype)"),
                  Message(r"Flash Attention 2(?:\.0)? only supports torch\.float16 and torch\.bfloat16 dtypes\. "
                          r"You passed torch\.float32", "own",
                          "transformers < 4.37 modeling_utils.py _check_and_enable_flash_attn_2"),),
        prior=1.0,
        tells_apart="the flash-attn kernel (or transformers' load check) names the float32 dtype it refuses"),
))


# DeepSpeed's FP16_Optimizer / FP16_UnfusedOptimizer (runtime/fp16/fused_optimizer.py, unfused_optimizer.py) kept an
# fp32 master copy of every parameter of their groups until PR #8029 filtered requires_grad, as BF16_Optimizer did
# since 0.9.1; PR #7515 (0.17.6, "Enable non-ZeRO mode") routed bf16 without ZeRO there too. The filter is in PyPI's
# 0.19.1 sdist (not in 0.19.0's), measured on CPU: a tiny LoRA model with model.parameters() got fp32 masters for
# all 117,056 parameters under 0.19.0 and for its 2,048 trainable ones under 0.19.1.
STAGE0_BF16_TO_FP16_OPTIMIZER = "0.17.6"
STAGE0_FROZEN_FILTERED = "0.19.1"


def _stage0_masters(s: Combination) -> bool:
    if not (s.engine_spec.zero and s.zero_stage == 0 and s.frozen_params and s.optimizer_holds_frozen):
        return False
    if s.precision.startswith("fp16"):
        return True
    return s.precision.startswith("bf16") and not older(s, "deepspeed", STAGE0_BF16_TO_FP16_OPTIMIZER)


register(Rule(
    id="zero0-frozen-master-copies",
    title="DeepSpeed without ZeRO keeps fp32 masters and optimizer state for every frozen weight",
    verdict="fix",
    impact="slow",
    conditions="DeepSpeed with ZeRO stage 0 (or no zero_optimization block) in fp16, or in bf16 with deepspeed "
               ">= 0.17.6, an optimizer built over every parameter (model.parameters() handed to deepspeed."
               "initialize or to the optimizer) while the base is frozen, deepspeed < 0.19.1",
    knobs=("optimizer_holds_frozen", "zero_stage"),
    affected={"deepspeed": f"<{STAGE0_FROZEN_FILTERED}"},
    boundaries={"deepspeed": (STAGE0_BF16_TO_FP16_OPTIMIZER,)},
    when=_stage0_masters,
    cause=("Without ZeRO, DeepSpeed wraps a half-precision run's optimizer in FP16_Optimizer, which flattens every "
           "parameter of its groups into an fp32 master copy and steps the optimizer once at start-up to create its "
           "state: frozen base weights included, so a LoRA run pays about 16 bytes per base parameter (fp32 master, "
           "Adam's two moments, a flat half copy) on every GPU, and a 7B model goes out of memory inside "
           "deepspeed.initialize. bf16 took the same path from 0.17.6 (PR #7515), where BF16_Optimizer had "
           "filtered frozen weights. ZeRO-1/2/3 build their groups from trainable parameters only."),
    fix="loraflow builds the optimizer over the trainable parameters only.",
    remedy=lambda s: {"optimizer_holds_frozen": False},
    elsewhere="hand deepspeed.initialize only the trainable parameters (model_parameters=[p for p in "
              "model.parameters() if p.requires_grad], and build any optimizer of your own over them); or ZeRO "
              "stage 1 or above; or deepspeed >= 0.19.1 (PR #8029)",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/8029",
                "https://github.com/deepspeedai/DeepSpeed/pull/7515",
                "https://github.com/deepspeedai/DeepSpeed/issues/2615",
                "https://github.com/deepspeedai/DeepSpeed/blob/v0.19.1/deepspeed/runtime/fp16/unfused_optimizer.py "
                "(every parameter of the group gets an fp32 copy)"),
    fixed_in="deepspeed 0.19.1",
))

# model_type -> the transformers releases ([first, first without), ...) whose FlashAttention-2 branch refuses a
# right-padded batch while the KV cache is on, read from the modeling files of the 4.36 - 4.53 wheels: Mistral's
# check from 4.36; Qwen2 and Mixtral from 4.37, Phi-3, Starcoder2 and Qwen2-MoE from 4.41 until 4.42 moved them to
# Llama's mask and 4.49 brought the check back with Qwen2-VL (4.48), Qwen2.5-VL and, in 4.52, Qwen3; 4.53's
# masking_utils dropped it everywhere.
FA2_RIGHT_PAD = {"mistral": (("4.36.0", "4.53.0"),),
                 **{t: (("4.37.0", "4.42.0"), ("4.49.0", "4.53.0")) for t in ("qwen2", "mixtral")},
                 **{t: (("4.41.0", "4.42.0"), ("4.49.0", "4.53.0")) for t in ("phi3", "starcoder2", "qwen2_moe")},
                 "qwen2_vl": (("4.48.0", "4.53.0"),), "qwen2_5_vl": (("4.49.0", "4.53.0"),),
                 **{t: (("4.52.0", "4.53.0"),) for t in ("qwen3", "qwen3_moe")}}


def _fa2_pad_checked(s: Combination) -> bool:
    windows = FA2_RIGHT_PAD.get(s.model_type or "")
    if windows is None:
        return False
    installed = s.version("transformers")
    return installed is None or any(Version(a) <= installed < Version(b) for a, b in windows)


register(Rule(
    id="fa2-right-padding-cache",
    title="FlashAttention-2 refuses a right-padded batch while the KV cache is on",
    verdict="fix",
    impact="crash",
    conditions="FlashAttention-2 on a Mistral-style model of transformers 4.36 - 4.52 (Mistral, Mixtral, Qwen2, "
               "Qwen2-MoE, Qwen2/2.5-VL, Phi-3, Starcoder2, Qwen3; each in the releases that have the check) and a "
               "forward with the KV cache on over right-padded rows: training without checkpointing, several rows "
               "per micro-batch and no packing, with config.use_cache true (evaluation and reference or old-policy "
               "log-prob passes that keep the cache fail the same way; check does not read those)",
    knobs=("use_cache", "flash_attention"),
    affected={"transformers": ">=4.36.0,<4.53.0"},
    boundaries={"transformers": tuple(sorted({v for w in FA2_RIGHT_PAD.values() for r in w for v in r},
                                             key=Version))},
    when=lambda s: (s.flash_attention and s.use_cache and s.checkpointing == "off" and s.padded_rows
                    and not s.packing and _fa2_pad_checked(s)),
    cause=("These models' FlashAttention-2 branch guards generation: with the cache on, a batch whose last column is "
           "padding would put the next token after the pads, so it raises `You are attempting to perform batched "
           "generation with padding_side='right'`. The guard looks at the cache, not at generation, and "
           "config.use_cache is true by default; checkpointing turns it off only in train mode. Training collators "
           "pad on the right, so the first forward that keeps the cache (training without checkpointing, an "
           "evaluation, a reference model's log-probs) stops. transformers 4.53 dropped the guard."),
    fix="loraflow runs every training and scoring forward with use_cache=False.",
    remedy=lambda s: {"use_cache": False},
    elsewhere="model.config.use_cache = False after loading (TRL: model_init_kwargs={'use_cache': False}; "
              "--use_cache false), or attn_implementation='sdpa', or transformers >= 4.53; left padding helps only "
              "where the collator honours it",
    references=("https://github.com/huggingface/trl/issues/1018", "https://github.com/huggingface/trl/issues/1217",
                "https://github.com/huggingface/trl/issues/1477", "https://github.com/huggingface/trl/issues/3306",
                "https://github.com/huggingface/trl/issues/3034",
                "https://github.com/brendanhogan/DeepSeekRL-Extended/issues/4",
                "https://github.com/dhcode-cpp/X-R1/issues/63"),
    fixed_in="transformers 4.53.0",
    log=LogSigns(
        messages=(Message(r"You are attempting to perform batched generation with padding_side='right'", "own",
                          "transformers models/mistral (qwen2, ...) FlashAttention-2 branch, 4.36 - 4.52"),),
        prior=1.0,
        tells_apart="the FlashAttention-2 branch refuses a right-padded batch with the KV cache on"),
))
