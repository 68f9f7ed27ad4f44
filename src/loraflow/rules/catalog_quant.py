"""The rules of quantized bases (QLoRA: bitsandbytes 4-bit and 8-bit weights under adapters). The storage-dtype rule
of sharded 4-bit weights is with the other sharding rules (catalog_sharded.py: qlora-storage-dtype)."""

from __future__ import annotations

from loraflow.rules.refusals import BNB_CALLED, INT8_SHARDED, KBIT_FULL_FINETUNE, KBIT_MERGE, PTQ_ZERO3
from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import BNB_CAST, BNB_MOVED, BNB_SHAPE, FLATTEN_DTYPE, Evidence, LogSigns, Message

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
        messages=(BNB_SHAPE,),
        frames=(Message(r"functional\.py:_convert_weight_packed_for_cpu$", "own"),),
        evidence=(Evidence("bnb:cpu-repack", 8, "the traceback passes through bitsandbytes' CPU repack",
                           decisive=True),
                  Evidence("quant4bit", 3, "a 4-bit base is in use")),
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
                          "transformers Trainer: validate_quantization_for_training"),
                  Message(r"only Tensors of floating point dtype can require gradients", "shared",
                          "torch: requires_grad_ on a packed (uint8) 4-bit weight"),
                  *KBIT_FULL_FINETUNE),  # frameworks' refusals (refusals.py)
        evidence=(Evidence("quant4bit", 4, "a 4-bit base is in use: its packed weights are integers"),
                  Evidence("input_grad_hook", -8, "an input-requires-grad hook asked an integer activation (token "
                           "ids) to require grad, not a quantized weight", excludes=True)),
        prior=1.0,
        tells_apart="transformers' Trainer refuses a quantized model without trainable adapters"),
))

register(Rule(
    id="kbit-int8-fsdp2",
    title="8-bit (LLM.int8) weights under FSDP2 lose their quantization state",
    verdict="error",
    impact="crash",
    conditions="a bitsandbytes 8-bit base sharded by FSDP2",
    knobs=("quantization", "engine"),
    when=lambda s: s.quantization == "8bit" and s.dtensor_params,
    cause=("FSDP2 replaces each sharded weight with a plain parameter and gathers it into another plain parameter. "
           "bitsandbytes' Linear8bitLt reads its int8 codes and row scales (CB, SCB) from the weight object itself, "
           "and unlike Linear4bit (which keeps its quantization state on the module and restores it at each "
           "forward) it has no way back, so the first forward fails: `'Parameter' object has no attribute 'CB'` "
           "(seen with torch 2.13, bitsandbytes 0.50.2)."),
    fix="Use model.quantization.method=nf4 under FSDP2 (4-bit layers restore their state), or parallel.engine=ddp "
        "or DeepSpeed for an 8-bit base.",
    elsewhere="load the base in 4 bits (load_in_4bit) for FSDP2, or train an 8-bit base with DDP",
    references=("https://github.com/bitsandbytes-foundation/bitsandbytes/blob/main/bitsandbytes/nn/modules.py "
                "(Linear8bitLt.forward; Linear4bit's fix_4bit_weight_quant_state_from_module)",),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"'Parameter' object has no attribute '(CB|SCB)'", "own",
                          "bitsandbytes Linear8bitLt.forward", "bitsandbytes 0.50.2 (seen)"),
                  INT8_SHARDED),  # LLaMA-Factory's refusal of an 8-bit base under ZeRO-3 or FSDP (refusals.py)
        evidence=(Evidence("fsdp", 2, "FSDP is in use"), Evidence("fsdp2", 2, "FSDP2 is in use"),
                  Evidence("zero3", -3, "ZeRO-3 shards the 8-bit base instead")),
        prior=1.0,
        tells_apart="an 8-bit (load_in_8bit) base under FSDP: the weight lost the int8 state bitsandbytes keeps "
                    "on it"),
))

register(Rule(
    id="kbit-int8-fsdp1",
    title="8-bit (LLM.int8) weights cannot be flattened by FSDP1",
    verdict="error",
    impact="crash",
    conditions="a bitsandbytes 8-bit base wrapped by FSDP1 (FullyShardedDataParallel)",
    knobs=("quantization", "engine"),
    when=lambda s: s.quantization == "8bit" and s.flat_params,
    cause=("bitsandbytes keeps an 8-bit layer's weight as int8 codes (Int8Params). FSDP1 flattens each unit's "
           "parameters into one tensor of one dtype and refuses the mix: `Must flatten tensors with uniform dtype "
           "but got torch.float32 and torch.int8` (`Cannot flatten integer dtype tensors` when the int8 weight comes "
           "first), with use_orig_params on or off (seen with torch 2.13, bitsandbytes 0.50.2 on the CPU). Unlike "
           "4-bit weights, whose packed storage can take the model's dtype (bnb_4bit_quant_storage), 8-bit codes "
           "have no such setting. llama-recipes refuses the setup from 0.0.3 (`8bit quantization is not supported "
           "with FSDP, please use 4bit quantization`)."),
    fix="loraflow has no FSDP1 engine, and refuses an 8-bit base under FSDP2 too (kbit-int8-fsdp2): use "
        "model.quantization.method=nf4 with FSDP2, or parallel.engine=ddp or DeepSpeed for an 8-bit base.",
    elsewhere="load the base in 4 bits with bnb_4bit_quant_storage set to the model's dtype for FSDP, or train the "
              "8-bit base with DDP",
    references=("https://github.com/pytorch/pytorch/blob/main/torch/distributed/fsdp/_flat_param.py "
                "(_validate_tensors_to_flatten)",
                "https://github.com/meta-llama/llama-recipes/issues/556",
                "https://github.com/meta-llama/llama-cookbook/blob/main/src/llama_cookbook/finetuning.py "
                "(8bit quantization refused with FSDP)"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"8bit quantization is not supported with FSDP", "own",
                          "llama-recipes finetuning.py main", ">=0.0.3"),
                  FLATTEN_DTYPE,
                  Message(r"Cannot flatten integer dtype tensors", "shared",
                          "torch/distributed/fsdp/_flat_param.py: _validate_tensors_to_flatten", "torch>=2.1"),
                  INT8_SHARDED),  # LLaMA-Factory's refusal of an 8-bit base under ZeRO-3 or FSDP (refusals.py)
        evidence=(Evidence("quant8bit", 4, "an 8-bit (LLM.int8) base is in use"),
                  Evidence("zero3", -3, "ZeRO-3 shards the 8-bit base instead"),
                  Evidence("fsdp2", -3, "FSDP2 shards the 8-bit base instead"),
                  Evidence("flatten:int-codes", 3, "FSDP flattens int8 weights beside float ones"),
                  Evidence("fsdp", 1, "FSDP is in use"),
                  Evidence("ptq", -6, "a post-training-quantized checkpoint is named instead"),
                  Evidence("flatten:int32", -8, "int32 words: GPTQ / AWQ packing, not LLM.int8", excludes=True),
                  Evidence("flatten:half-and-float", -6, "only float dtypes differ: no quantized weights")),
        prior=1.0,
        tells_apart="an 8-bit (load_in_8bit) base under FSDP1; torch.int8 in FSDP's dtype refusal"),
))

register(Rule(
    id="kbit-int8-zero3",
    title="ZeRO-3 saves no memory on 8-bit weights",
    verdict="warning",
    impact="silent",
    conditions="a bitsandbytes 8-bit base under DeepSpeed ZeRO-3",
    knobs=("quantization", "zero_stage"),
    when=lambda s: s.quantization == "8bit" and s.zero3,
    cause=("ZeRO-3 partitions the 8-bit weight parameters, but bitsandbytes' Linear8bitLt keeps its own full copy "
           "of each layer's int8 codes on the module (its matmul state, set up at the first forward) and computes "
           "from that copy. Training is correct, and every rank still holds every 8-bit weight (seen with "
           "deepspeed 0.19.8, bitsandbytes 0.50.2)."),
    fix="Use model.quantization.method=nf4 (4-bit weights are partitioned for real under ZeRO-3), or expect the "
        "8-bit base's full size on every rank.",
    elsewhere="load the base in 4 bits (load_in_4bit) when ZeRO-3 must shard it",
    references=("https://github.com/bitsandbytes-foundation/bitsandbytes/blob/main/bitsandbytes/nn/modules.py "
                "(Linear8bitLt.init_8bit_state)",),
    fixed_in=None,
    # LLaMA-Factory refuses an 8-bit base under ZeRO-3 (and FSDP): shared with the FSDP rules, told apart by the engine.
    log=LogSigns(messages=(INT8_SHARDED,),
                 evidence=(Evidence("zero3", 3, "DeepSpeed ZeRO-3 shards the 8-bit base"),
                           # fsdp1/fsdp2, not `fsdp`: the refusal's own words name fsdp.
                           Evidence("fsdp1", -3, "FSDP shards the 8-bit base instead"),
                           Evidence("fsdp2", -3, "FSDP2 shards the 8-bit base instead")),
                 prior=1.5,
                 tells_apart="an 8-bit base (quantization_bit 8) under ZeRO-3; under FSDP see kbit-int8-fsdp1/2"),
))

register(Rule(
    id="kbit-merge",
    title="An adapter merged into 4-bit or 8-bit base weights",
    verdict="fix",
    impact="silent",
    conditions="a bitsandbytes 4-bit or 8-bit base and an adapter merged into it: merge_and_unload on the quantized "
               "model, a sync that merges the adapter into the quantized weights for an inference engine and "
               "unmerges it after (TRL's use_vllm with a QLoRA policy), a merge command that loads the base quantized",
    knobs=("merge_into_quantized", "quantization"),
    when=lambda s: s.quantization is not None and s.merge_into_quantized,
    cause=("A quantized weight has no float storage to add the adapter's delta to: PEFT dequantizes it, adds B@A "
           "and quantizes the sum again. The second quantization rounds the delta (an NF4 code has 16 levels per "
           "block), so the merged model no longer computes what was trained; a merge-then-unmerge round trip at "
           "every engine sync also leaves the trained base a little different after each step. Where the result "
           "must be moved or cast (a merged 4-bit model saved in another dtype), transformers refuses outright."),
    fix="loraflow merges into the dequantized base, never into the 4-bit codes: `loraflow merge` writes the base "
        "with the adapter merged in at the compute precision, and a QLoRA policy's merged vLLM sync sends every "
        "quantized weight dequantized with the adapter added.",
    remedy=lambda s: {"merge_into_quantized": False},
    elsewhere="load the base unquantized (bf16/fp16) to merge, or serve the adapter unmerged (an inference engine's "
              "LoRA support, TRL's adapter sync where the release has it)",
    references=("https://github.com/huggingface/peft/issues/1043", "https://github.com/huggingface/peft/issues/2501",
                "https://github.com/huggingface/trl/pull/5188",
                "https://github.com/axolotl-ai-cloud/axolotl/issues/596",
                "https://github.com/axolotl-ai-cloud/axolotl/pull/2511",
                "https://github.com/huggingface/peft/blob/main/src/peft/tuners/lora/bnb.py (Linear4bit.merge)"),
    fixed_in="design",
    log=LogSigns(
        frames=(Message(r"peft[/\\.]tuners[/\\.]lora[/\\.]bnb\.py:(merge|unmerge)$", "own"),),
        messages=(Message(r"Merge lora module to (4|8)-bit linear may get different generations due to rounding "
                          r"errors", "warning", "peft/tuners/lora/bnb.py: Linear4bit.merge / Linear8bitLt.merge"),
                  Message(r"Unmerge lora module to (4|8)-bit linear may get different generations due to rounding "
                          r"errors", "warning", "peft/tuners/lora/bnb.py: unmerge"),
                  BNB_CAST, BNB_MOVED,
                  *KBIT_MERGE),  # frameworks' refusals to merge into quantized weights (refusals.py)
        # LLaMA-Factory's export refuses a GPTQ/AWQ checkpoint with the same sentence as a bitsandbytes one: no
        # rounding of bitsandbytes' codes is at stake there.
        evidence=(Evidence("ptq", -6, "a post-training-quantized checkpoint (GPTQ, AWQ), not a bitsandbytes base, "
                           "is named", excludes=True),
                  Evidence("load_dispatch", -6, "the refusal is raised while the model loads (accelerate's "
                           "dispatch_model in from_pretrained), before any adapter exists", excludes=True),
                  Evidence("merge", 4, "the adapter is merged (merge_and_unload, merge_adapter)", decisive=True),
                  Evidence("merge_frames", 3, "the traceback runs through a LoRA merge"),
                  Evidence("quant4bit", 4, "a quantized base is in use: the merge goes into its 4-bit codes")),
        prior=0.5,
        tells_apart="PEFT's rounding warning at the merge, or a merge call on the traceback of transformers' refusal "
                    "to move or cast a quantized model"),
))

register(Rule(
    id="kbit-model-moved",
    title="A 4-bit or 8-bit model moved to another device after loading",
    verdict="fix",
    impact="crash",
    conditions="a bitsandbytes-quantized model (the policy, a reference or a reward model) moved or cast after it "
               "was loaded: a DeepSpeed engine wrapping it calls module.to(device), accelerate prepares a model "
               "loaded on another device than its rank's",
    knobs=("quantized_moved", "quantization"),
    when=lambda s: s.quantization is not None and s.quantized_moved,
    cause=("bitsandbytes places and quantizes the weights while the model loads; transformers refuses to move or "
           "cast the result (8-bit always, 4-bit before bitsandbytes 0.43.2), and accelerate refuses to train a "
           "quantized model on another device than the one it was loaded on. A DeepSpeed engine built around a "
           "quantized model moves it to its device at construction, and a multi-process run that loads a quantized "
           "model without a per-rank device_map puts every rank's copy on the first GPU."),
    fix="loraflow loads a quantized model on its rank's device (device_map {'': local rank}) and never moves or "
        "casts it afterwards.",
    remedy=lambda s: {"quantized_moved": False},
    elsewhere="load quantized models with device_map={'': local_rank} (PartialState().process_index) on every rank "
              "(none under ZeRO-3, which refuses a device_map: rule zero3-device-map-load), and keep quantized "
              "reference or reward models out of a DeepSpeed engine (or load them unquantized)",
    references=("https://github.com/OpenRLHF/OpenRLHF/issues/403", "https://github.com/huggingface/trl/issues/2760",
                "https://github.com/huggingface/transformers/blob/main/src/transformers/modeling_utils.py "
                "(PreTrainedModel.to)",
                "https://github.com/huggingface/accelerate/blob/main/src/accelerate/accelerator.py (prepare_model)"),
    fixed_in="design",
    log=LogSigns(
        messages=(BNB_MOVED, BNB_CAST, BNB_CALLED,
                  Message(r"You can't train a model that has been loaded in 8-bit (or 4-bit )?precision on a "
                          r"different device", "own", "accelerate/accelerator.py: prepare_model",
                          "accelerate>=0.17 (`in 8-bit precision` before 1.0)")),
        frames=(Message(r"deepspeed[/\\.]runtime[/\\.]engine\.py:_configure_distributed_model$", "shared"),
                Message(r"accelerate[/\\.]accelerator\.py:prepare_model$", "generic")),
        evidence=(Evidence("load_dispatch", -6, "the refusal is raised while the model loads (accelerate's "
                           "dispatch_model in from_pretrained), not by a move after it", excludes=True),
                  Evidence("deepspeed", 2, "a DeepSpeed engine moves the model it wraps to its device"),
                  Evidence("quant4bit", 2, "a quantized model is in use"),
                  Evidence("accelerate:kbit-other-device-raise", 8, "the traceback stops on the raise of "
                           "accelerate's prepare_model that refuses a quantized model loaded on another device",
                           decisive=True, alone=True)),
        prior=1.0,
        tells_apart="no merge on the traceback: the model is moved by an engine's or accelerate's preparation"),
))

register(Rule(
    id="ptq-model-under-sharding",
    title="A post-training-quantized checkpoint sharded by ZeRO-3 or FSDP",
    verdict="error",
    impact="crash",
    conditions="a checkpoint saved quantized by GPTQ, AWQ, AQLM or compressed-tensors (integer weights loaded as they "
               "are) trained with adapters under DeepSpeed ZeRO-3 or FSDP",
    knobs=("ptq_checkpoint", "engine", "zero_stage"),
    when=lambda s: s.ptq_checkpoint is not None and s.sharded_params,
    cause=("A GPTQ or AWQ checkpoint keeps its linear weights as int32 words of packed 4-bit codes with float scales "
           "beside them, compressed-tensors w8a8 as int8: integer tensors that are not parameters an optimizer or a "
           "gradient reduction can handle. ZeRO-3 partitions every parameter and gathers them in one dtype, FSDP1 "
           "flattens each unit into one float tensor (`Must flatten tensors with uniform dtype but got "
           "torch.bfloat16 and torch.int8`), FSDP2 shards them as float DTensors; and the quantized kernels read "
           "their packed buffers whole. LLaMA-Factory refuses the setup before loading (`DeepSpeed ZeRO-3 or FSDP is "
           "incompatible with PTQ-quantized models`)."),
    fix="loraflow trains float bases and bitsandbytes quantization, and refuses a post-training-quantized checkpoint "
        "before it loads (plan/quantization.py): point model.path at the unquantized model and set "
        "model.quantization.method=nf4, which shards under ZeRO-3 and FSDP.",
    elsewhere="train the quantized checkpoint without sharding its weights (DDP or ZeRO-2: each GPU holds the whole "
              "model), or load the unquantized model in 4 bits with bitsandbytes (QLoRA) for ZeRO-3 / FSDP",
    references=("https://github.com/hiyouga/LlamaFactory/blob/main/src/llamafactory/model/model_utils/quantization.py "
                "(configure_quantization: PTQ-quantized models refused under ZeRO-3 or FSDP)",
                "https://github.com/hiyouga/LlamaFactory/issues/2974",
                "https://github.com/deepspeedai/DeepSpeed/issues/7096",
                "https://github.com/meta-llama/llama-cookbook/issues/945"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"ZeRO-3 or FSDP is incompatible with PTQ-quantized models", "own",
                          "LLaMA-Factory model_utils/quantization.py configure_quantization", ">=0.8"),
                  PTQ_ZERO3, FLATTEN_DTYPE),
        evidence=(Evidence("flatten:int32", 8, "FSDP flattens int32 weights: GPTQ / AWQ packed 4-bit codes",
                           decisive=True),
                  Evidence("flatten:int-codes", 3, "FSDP flattens signed integer weights (int8: a w8a8 checkpoint, "
                           "or bitsandbytes' LLM.int8 codes)"),
                  Evidence("ptq", 3, "a post-training-quantized checkpoint is named in the log"),
                  Evidence("quant8bit", -4, "an 8-bit bitsandbytes base is in use: its int8 codes, not a PTQ "
                           "checkpoint's"),
                  Evidence("flatten:int", -8, "uint8 storage: bitsandbytes' packed 4-bit, not a PTQ checkpoint",
                           excludes=True),
                  Evidence("flatten:half-and-float", -6, "only float dtypes differ: no quantized weights")),
        prior=0.5,
        tells_apart="the checkpoint was quantized after training (GPTQ, AWQ, compressed-tensors names; int32 or "
                    "int8 in FSDP's dtype refusal) and ZeRO-3 or FSDP shards it"),
))

FP8_TRAINABLE = "5.22.0"
"""transformers' FineGrainedFP8HfQuantizer.is_trainable turns True (quantizers/quantizer_finegrained_fp8.py of the
5.21.1 and 5.22.0 wheels); before, the Trainer's validate_quantization_for_training refuses any adapter run on it."""


register(Rule(
    id="fp8-checkpoint-not-trainable",
    title="Adapters trained on a checkpoint published in FP8",
    verdict="error",
    impact="crash",
    conditions="a base checkpoint that ships FP8 weights (config.json quantization_config quant_method fp8: "
               "DeepSeek-V3/R1, Kimi-K2, MiniMax-M2, `-FP8` uploads) trained with adapters through the HF Trainer "
               "(TRL, Unsloth, LLaMA-Factory, axolotl) on transformers < 5.22",
    knobs=("fp8_checkpoint",),
    affected={"transformers": f"<{FP8_TRAINABLE}"},
    when=lambda s: s.fp8_checkpoint and s.adapter != "full" and s.accumulation_loop == "hf-trainer",
    cause=("The checkpoint's config names its quantization, so from_pretrained loads it through transformers' "
           "fine-grained FP8 quantizer (FP8Linear modules) whatever torch_dtype asks. The Trainer checks at "
           "construction that a quantized model's quantizer is trainable, adapters or not, and that quantizer said "
           "it was not until transformers 5.22: `The model you are trying to fine-tune is quantized with "
           "QuantizationMethod.FP8 but that quantization method do not support training`. Releases without the "
           "FP8 quantizer refuse the config at load (`Unknown quantization type, got fp8`)."),
    fix="loraflow loads its base unquantized or with bitsandbytes: start from the checkpoint's bf16 release.",
    elsewhere="transformers >= 5.22; on 5.0 - 5.21 load with quantization_config=FineGrainedFP8Config(dequantize=True) "
              "(bf16 weights); else the bf16 release of the model or a copy cast to bf16 offline (DeepSeek's "
              "fp8_cast_bf16.py)",
    references=("https://github.com/huggingface/transformers/issues/37927",
                "https://github.com/huggingface/transformers/issues/41516",
                "https://github.com/MiniMax-AI/MiniMax-M2/issues/48",
                "https://github.com/huggingface/transformers/issues/46295",
                "https://github.com/huggingface/transformers/issues/46736",
                "https://github.com/hiyouga/LlamaFactory/issues/6777"),
    fixed_in=f"transformers {FP8_TRAINABLE}",
    log=LogSigns(
        messages=(Message(r"The model you are trying to fine-tune is quantized with (QuantizationMethod\.)?FP8 but "
                          r"that quantization method do not support training", "own",
                          "transformers trainer.py Trainer.__init__ (trainer_utils.py validate_quantization_for_"
                          "training in 5.x)"),
                  Message(r"Unknown quantization type, got fp8", "own",
                          "transformers quantizers/auto.py before its FP8 quantizer")),
        prior=1.0,
        tells_apart="the Trainer (or the loader) refuses the checkpoint's FP8 quantization"),
))
