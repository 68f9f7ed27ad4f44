"""How a rule's failure shows in a log, declared on the rule itself (`Rule.log`) and read by `loraflow explain`.

A failure leaves three kinds of traces: the message its raise site prints (with every wording that site has had
across releases), the functions on its raise path (what a traceback shows even when the paste stops before the
message), and facts about the run that tell it apart from other failures printing the same text (a shape that
became [0], a ZeRO-3 frame, a dtype pair). The facts a rule may cite are named here once, in FACTS, with the
spellings their sources use; `explain` computes them per log, plus the structured ones read from a message's
numbers (STRUCTURED_FACTS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from loraflow.families import FP16_OVERFLOW

MessageKind = Literal["own", "shared", "generic", "warning"]


@dataclass(frozen=True)
class Message:
    """A text the failure prints. `own`: only this failure prints it (found: confirmed). `shared`: a small known
    set of failures print it (alone: a possible cause, ranked by `LogSigns.prior`; with facts: likely or confirmed).
    `generic`: many unrelated failures print it (claimed only with facts that point here). `warning`: printed
    while the run goes on; with no crash after it, the failure was silent."""
    pattern: str
    kind: MessageKind = "own"
    raised_by: str = ""
    """The raise site: `torch/utils/checkpoint.py: check_recomputed_tensors_match`."""
    releases: str = ""
    """The releases that print this wording (`torch<2.1`); empty: every release known to raise it."""
    stops: bool = False
    """(A frame) the failure is raised in this function itself, so a log cut at its raise ends on this frame: a
    traceback that goes on into further calls passed it (`auto_factory.py:from_pretrained` that calls on into the
    model class's own from_pretrained found the class; its refusal is not what stopped the log)."""


@dataclass(frozen=True)
class Evidence:
    """A fact in the log that makes this rule more (weight > 0) or less (< 0) likely. `decisive`: with one of the
    rule's shared or generic messages, this fact alone confirms the rule."""
    fact: str
    weight: float
    reason: str
    decisive: bool = False
    alone: bool = False
    """This fact names the failure even without its message: a log cut off before its error line still shows it
    (a metadata pair, the dtypes of a flatten error, torch's reentrant warning before a crash)."""
    excludes: bool = False
    """This fact shows a mechanism the failure cannot be: with it in the log the rule is not claimed, even on its own
    message (a raise site that several mechanisms reach, where the log names the one this rule is not)."""


@dataclass(frozen=True)
class LogSigns:
    messages: tuple[Message, ...] = ()
    frames: tuple[str, ...] = ()
    """Regular expressions over `path:function` of traceback frames on the raise path. A log that stops inside
    one of them, before any error line, still names the failure."""
    evidence: tuple[Evidence, ...] = ()
    prior: float = 1.0
    """How common this cause is among those printing the same shared message (ranks `possible` candidates)."""
    tells_apart: str = ""
    """What in a log or setup points to this cause rather than the others sharing its message: what to check first."""


# The lines of accelerate/accelerator.py where prepare_model raises "You can't train a model that has been loaded in
# 8-bit [or 4-bit] precision on a different device", in releases 0.17.0-1.14.0, kept only where no release has another
# raise of prepare_model on the same line (read from each tag's source with ast). A traceback that stops on one of
# them, at the `raise ValueError(` itself, is that refusal even when the paste ends before the message.
_ACCELERATE_OTHER_DEVICE_RAISE_LINES = (1151, 1187, 1208, 1254, 1257, 1258, 1281, 1324, 1331, 1353, 1377, 1402, 1418,
                                        1423, 1425, 1441, 1449, 1491, 1504, 1608, 1629, 1786, 1792, 1816, 1850, 1861)

# The HF Trainer's bitsandbytes 8-bit optimizers (transformers training_args.py OptimizerNames; axolotl's and
# LLaMA-Factory's optimizer keys take the same names), read by check's frontends too. torchao's adamw_torch_8bit is
# not bitsandbytes'.
BNB_8BIT_OPTIMIZERS = r"(paged_)?(adamw_bnb_8bit|adamw_8bit|adam_8bit|lion_8bit|ademamix_8bit|rmsprop_bnb_8bit)"
_FP16_OVERFLOW_IDS = "|".join(f"(?:{family.names})" for family in FP16_OVERFLOW.values())
_FP16_OVERFLOW_CLASSES = "|".join(sorted({re.sub(r"_([a-z])", lambda m: m.group(1).upper(), t.capitalize())
                                          for t in FP16_OVERFLOW} | {"MT5", "UMT5", "Gemma3n"}))
"""The class-name prefix transformers gives each family's modules (gemma3 -> Gemma3, gpt_oss -> GptOss, qwen3_5 ->
Qwen3_5)."""

# Facts read from a log by pattern. Paths match with / or \ and module dots; names in any case, as users paste them.
_P = r"[/\\.]"
# A frame's function as IPython and Jupyter print it: qualified by its class (`in LoraModel.merge_and_unload(self)`,
# `in Linear8bitLt.forward(self, x)`) or its enclosing function (`in add_hook_to_module.<locals>.new_forward`).
_IN = r"in (?:[A-Z]\w*\.|\w+\.<locals>\.)?"
FACTS: dict[str, tuple[str, str]] = {
    "deepspeed": (r"\bdeepspeed\b|\bds_config|zero_optimization", "DeepSpeed is in use"),
    "zero3": (rf"deepspeed{_P}runtime{_P}zero{_P}(stage3|partition_parameters|parameter_offload|"
              rf"partitioned_param_coordinator)|\bzero[_-]?stage\W{{1,4}}3\b|\bzero[-_ ]?3\b|\bstage3_|"
              r"\"stage\"\s*:\s*3\b|ZeRO[- ]Stage 3|\bds_z3|zero3\.json|\bdeepspeed_stage_3\b",
              "DeepSpeed ZeRO-3 is in use"),
    "zero3_hooks": (rf"deepspeed{_P}runtime{_P}zero{_P}(parameter_offload|partitioned_param_coordinator|stage3)",
                    "ZeRO-3 parameter hooks are in the traceback"),
    "fsdp1": (rf"torch{_P}distributed{_P}fsdp{_P}(_flat_param|fully_sharded_data_parallel|_runtime_utils|_init_utils|"
              r"_wrap_utils)|FlatParam(eter|Handle)|FullyShardedDataParallel\b|fsdp_version\W{1,4}1\b",
              "FSDP1 (flat parameters) is in use"),
    "fsdp2": (rf"_composable{_P}fsdp|fsdp{_P}_fully_shard|\bfully_shard\b|FSDPModule|_fsdp_param|"
              r"fsdp_version\W{1,4}2\b|MixedPrecisionPolicy", "FSDP2 (fully_shard) is in use"),
    "fsdp": (r"\bfsdp|fully_?shard", "FSDP is in use"),
    "checkpointing": (rf"torch{_P}utils{_P}checkpoint|gradient_checkpointing|activation_checkpointing|"
                      r"checkpoint_wrapper|CheckpointFunction|CheckpointError|\brecompute|grad_checkpoint|"
                      r"incompatible with gradient checkpointing",
                      "activation checkpointing is in use"),
    "reentrant": (r"CheckpointFunction|use_reentrant\W{1,4}true|use_reentrant_gc\W{1,4}true|pass in use_reentrant=True "
                  r"or use_reentrant=False explicitly|use_reentrant parameter should be passed explicitly|"
                  r"none of output has requires_grad=True",
                  "reentrant checkpointing is in use"),
    "nonreentrant": (r"unpack_hook|_checkpoint_without_reentrant|check_recomputed_tensors_match|"
                     r"use_reentrant\W{1,4}false", "non-reentrant checkpointing is in use"),
    "peft": (rf"\bpeft{_P}|PeftModel|LoraConfig|\blora_[AB]\b|\blora[_-](rank|dim|r|alpha|target)|use_peft|"
             r"\blora\b|finetuning_type\W{1,4}lora|--lora|qlora|\badapter", "an adapter (LoRA/PEFT) is trained"),
    "dora": (rf"\bdora\b|use_dora|DoraLinear|lora{_P}dora", "DoRA is in use"),
    # AdaLoRA keeps lora_A/lora_B/lora_E in ParameterDicts, so DDP names its parameters `...lora_B.default` where
    # LoRA's nn.Linear ones end in `.weight` (peft/tuners/adalora/layer.py); its orthogonal regularization reads them
    # again after the forward (AdaLoraModel.forward), a second gradient hook that find_unused_parameters=False does
    # not cure.
    "adalora": (r"\bAdaLora\w*|orth_reg_weight|RankAllocator|\.lora_E\b|"
                r"with name \S*\.lora_[AB]\.(?!weight\b|bias\b)\w+\s+has been marked",
                "AdaLoRA is in use (its config, or a parameter named as its ParameterDicts name them)"),
    "unsloth": (r"\bunsloth\b|use_unsloth", "Unsloth loads and patches the model"),
    # A family whose activations overflow float16, by its model id (families.FP16_OVERFLOW) or its modules' class
    # names in a traceback or hook message (Gemma3MLP, T5LayerFF, GptOssMLP).
    "fp16_overflow_family": (_FP16_OVERFLOW_IDS + r"|\b(" + _FP16_OVERFLOW_CLASSES + r")(Text|Vision)?(MLP|RMSNorm|"
                             r"DecoderLayer|"
                             r"Attention|Block|Layer\w*|Model|ForCausalLM|ForConditionalGeneration)\b",
                             "a model family whose activations overflow float16 (Gemma 3/4, T5, gpt-oss, ...)"),
    "diffusers": (r"diffusers[/\\.](models|pipelines|training_utils)", "diffusers' code is in the traceback"),
    "fsdp_optim_state": (r"fsdp[/\\.]_optim_utils|save_fsdp_optimizer|full_optim_state_dict|\boptim_state_dict\(",
                         "FSDP gathers or re-shards the optimizer's state (a checkpoint save)"),
    "bnb_8bit_optim": (rf"\b{BNB_8BIT_OPTIMIZERS}\b|\b(Paged)?(AdamW|Adam|Lion|AdEMAMix)8bit\b|bitsandbytes[/\\.]optim",
                       "a bitsandbytes 8-bit optimizer is in use"),
    "quant4bit": (r"bitsandbytes|Params4bit|Linear4bit|load_in_4bit|quantization_bit\W{1,4}4\b|\bnf4\b|\bqlora\b|"
                  r"use_4bit", "a 4-bit quantized base is in use"),
    # A checkpoint quantized after training: its method named (config.json quant_method, a loader's log line, a
    # kernel class: auto-gptq/gptqmodel QuantLinear, AutoAWQ WQLinear) or its name (Qwen's -Int4/-Int8 are GPTQ).
    "ptq": (r"\bgptq\w*|\bawq\b|\baqlm\b|compressed[-_]tensors|\bw(4|8)a(8|16)\b|QuantLinear|WQLinear|"
            r"-Int[48]\b|PTQ-quantized", "a checkpoint quantized after training (GPTQ, AWQ, AQLM, compressed-tensors) "
            "is in use"),
    # bitsandbytes' LLM.int8 in use: its layer and parameter classes, or a setting that turns it on (a config dump
    # printing load_in_8bit false must not count).
    "quant8bit": (r"Linear8bitLt|Int8Params|load_in_8bit\W{1,4}true\b|quantization_bit\W{1,4}8\b|"
                  r"--quantization\W{1,4}8bit|\bllm\.int8\b", "an 8-bit (LLM.int8) base is in use"),
    "bnb:cpu-repack": (r"_convert_weight_packed_for_cpu", "bitsandbytes' in-place CPU repack of a 4-bit weight is "
                       "in the traceback"),
    "int_requires_grad": (r"only Tensors of floating point dtype can require gradients",
                          "an integer tensor was asked to require grad"),
    # A forward hook that makes a module's input or output require grad (for checkpointing a frozen base):
    # transformers' enable_input_require_grads (make_inputs_require_grads), unsloth_zoo's peft_utils.py
    # requires_grad_pre_hook/_post_hook. Placed on a module that takes token ids, it asks an integer activation,
    # not a weight, to require grad.
    "input_grad_hook": (r"\brequires_grad_(?:pre|post)_hook\b|\bmake_inputs_require_grads?\b|"
                        r"\b(?:input|output)s?\[0\]\.requires_grad_\(",
                        "a hook that makes a module's inputs require grad is on the raise path"),
    "half": (r"bfloat16|float16|\bbf16\b|\bfp16\b|\bhalf\b", "half precision is in use"),
    "kv_cache": (r"past_key_values?|\buse_cache\b|DynamicCache|\bkv[_ ]cache|cache_position|layer_past",
                 "the KV cache is involved"),
    "seq_parallel": (r"ring[_-]?attn|ring[_ -]attention|ulysses|sequence[_ -]parallel|context[_ -]parallel|"
                     r"\bcp_size\b|\bsp_size\b|sequence_parallel_(size|degree)|\bsp_degree\b",
                     "context or sequence parallelism is in use"),
    "generation": (r"\bgenerate\b|generation|rollout|experience_maker|make_experience|\bvllm\b",
                   "the model generates (RLHF rollouts)"),
    # TRL/ms-swift colocate mode (vLLM's config dump names the external_launcher backend they start it with),
    # OpenRLHF's hybrid engine, TRL 0.14's warning for a vLLM device that trains too. vLLM's sleep mode exists to hand
    # the GPU back to a trainer between rollouts (TRL vllm_enable_sleep_mode and ms-swift sleep_level are colocate
    # options, OpenRLHF --vllm_enable_sleep and verl's hybrid engine put a colocated engine to sleep): its allocator's
    # frames (vllm/device_allocator/cumem.py sleep, wake_up) and its log lines (gpu_worker.py `Sleep mode freed`,
    # executor_base.py `It took ... seconds to fall asleep` / `to wake up`) show an engine that shares its GPU.
    "vllm_colocated": (r"vllm_mode\W{1,4}colocate|distributed_executor_backend\W{1,4}external_launcher|"
                       r"colocate_all(_models)?\b|train\.colocate_all|is also used for training|"
                       r"device_allocator[/\\]cumem\.py\W.{0,40}\bin (wake_up|sleep)\b|Sleep mode freed [\d.]+ GiB|"
                       r"seconds to (fall asleep|wake up)",
                       "the vLLM engine shares the trainer's GPUs"),
    "zero3_gather_frames": (r"_allgather_params_coalesced|GatheredParameters",
                            "ZeRO-3 gathers partitioned parameters"),
    "vllm_sync_frames": (r"_move_model_to_vllm|_move_full_model_to_vllm|\bsync_weights\b|_iter_named_params|"
                         r"update_named_param", "the policy is synced to vLLM"),
    "zero3_bucket_check": (r"stage3_prefetch_bucket_size|validation errors? for DeepSpeedZeroConfig",
                           "DeepSpeed's ZeRO config validation is named"),
    # vLLM loading an image-text model's weights: its loaders for the models transformers 4.52 renamed (their
    # hf_to_vllm_mapper), and the RL frameworks' syncs that hand it a live state_dict (TRL and ms-swift
    # _move_model_to_vllm, verl and EasyR1 fsdp_vllm.py).
    "vlm_weight_load": (r"models[/\\](qwen2_5_vl|qwen2_vl|llava|gemma3_mm|mllama)\.py\W.{0,40}\bin load_weights\b|"
                        r"hf_to_vllm_mapper|_move_model_to_vllm|sharding_manager[/\\]fsdp_vllm\.py",
                        "vLLM loads an image-text model's weights"),
    "vision": (r"pixel_values|vision_tower|vision_model|\bvisual\b|Vision(Transformer|Model|Encoder)|\bvit\b|"
               r"image_grid_thw|patch_embed|\bvpm\b|siglip|clip_vision|vision_lora|freeze_vision|tune_vision|"
               r"\bmm_projector\b|\bVL\b|-VL-|llava", "a vision tower is in the model (a vision-language run)"),
    "vlm_config": (r"\w*(VL|Vision\w*|Llava\w*|Idefics\d?|PaliGemma|Mllama|MiniCPMV|InternVL\w*|Gemma3)Config\b",
                   "an image-text model's config class is named"),
    # A mixture-of-experts model: the router sends a step's tokens to some experts only, so the others (and their
    # adapters) get no gradient on that step. Names of MoE families and configs, and expert parameter names.
    "moe": (r"\bMoE\b|Mixtral|\bOLMoE|\bDBRX\b|\d+B-A\d+(\.\d+)?B\b|num_(local_)?experts|\bexperts\.\d+\.|"
            r"sparse_moe|router_aux_loss|output_router_logits", "a mixture-of-experts model is trained"),
    "causal_lm_load": (r"AutoModelForCausalLM\.from_pretrained", "a model is loaded through AutoModelForCausalLM"),
    # Collectives of one kind and different sizes on two ranks: they ran different modules (a rank that skipped some
    # also ran fewer of them, so the sequence numbers may differ too). Timeouts of different kinds (an all-to-all
    # beside an all-reduce, in two process groups) are collectives that merely hung together.
    "rank_sizes_differ": (r"OpType=(\w+), NumelIn=(\d+)\b[\s\S]{0,600}?OpType=\1, NumelIn=(?!\2\b)\d+",
                          "ranks timed out in collectives of different sizes (they ran different modules)"),
    "merge": (r"merge_and_unload|_unload_and_optionally_merge|fuse_lora|merge_adapter|\bin merge\b|"
              r"get_delta_weight|unfuse_lora|merge_lora|\bmerged?\b", "adapter weights are merged into the base"),
    # `grpo_trainer.py`, `train_ppo_ray`: `_` is a word character, so the names are bounded by letters only.
    "rlhf": (r"(?<![a-z])(?:ppo|grpo|rlhf)(?![a-z])|rollout|experience|actor|critic|reward", "an RLHF stage runs"),
    "ddp": (rf"DistributedDataParallel|torch{_P}nn{_P}parallel{_P}distributed|find_unused_parameters|\bddp\b|"
            r"reducer", "DDP is in use"),
    "find_unused": (r"find_unused_parameters\W{1,4}true", "DDP's unused-parameter search is on"),
    "save": (r"save_pretrained|save_model|save_checkpoint|\bsave_|state_dict|safetensors", "a model is saved"),
    "load": (r"load_state_dict|from_pretrained|load_adapter|size mismatch for", "a saved model is loaded"),
    "grad_scaler": (r"GradScaler|grad_scaler|unscale_", "fp16 loss scaling is in use"),
    # float16 itself, not bfloat16 (`\bfloat16` does not match inside `bfloat16`): Lightning's 16-true / 16-mixed,
    # float16 or bfloat16 switched on (not a dump's `fp16=False`): TrainingArguments' and accelerate's flags,
    # DeepSpeed's "fp16": {"enabled": true}, a float16 / bfloat16 load dtype.
    "fp16_on": (r"\bfp16\W{1,4}(True|true|1)\b|[\"']fp16[\"']\W{1,4}\{\W*[\"']enabled[\"']\W{1,4}(true|True)\b|"
                r"mixed_precision\W{1,4}fp16\b|\b16-mixed\b|torch_dtype\W{1,4}(torch\.)?float16\b",
                "float16 is switched on"),
    "fp16_off": (r"\bfp16\W{1,4}(False|false)\b", "float16 is switched off (a TrainingArguments dump's fp16=False)"),
    "bf16_on": (r"\bbf16\W{1,4}(True|true|1)\b|[\"']bf16[\"']\W{1,4}\{\W*[\"']enabled[\"']\W{1,4}(true|True)\b|"
                r"mixed_precision\W{1,4}bf16\b|\bbf16-(mixed|true)\b|torch_dtype\W{1,4}(torch\.)?bfloat16\b",
                "bfloat16 is switched on"),
    # HF's fp16 flags, DeepSpeed's "fp16": {"enabled": true}.
    "fp16": (r"\bfp16\b|\bfloat16\b|torch\.half\b|\b16-(true|mixed)\b|precision\W{1,4}16\b",
             "float16 (not bfloat16) is in use"),
    # DeepSpeed's own checkpoint files and the tools that consolidate them.
    "ds_checkpoint": (r"_model_states\.pt|_optim_states\.pt|zero_to_fp32|get_fp32_state_dict_from_zero_checkpoint|"
                      r"convert_zero_checkpoint_to_fp32_state_dict|load_state_dict_from_zero_checkpoint|"
                      r"\bglobal_step\d+\b", "a DeepSpeed checkpoint is saved, loaded or consolidated"),
    # Where PEFT builds an adapter: the functions that read the base weights (their shapes or values) while doing it.
    "peft_init_frames": (_IN + r"(get_peft_model|inject_adapter|update_layer|pissa_init|olora_init|corda_init|"
                         r"loftq_init|_get_in_out_features|_setup_prompt_encoder)\b|"
                         rf"peft{_P}tuners{_P}(lora{_P}layer|prompt_tuning{_P}model)\.py\", line \d+, in __init__\b",
                         "the traceback runs through PEFT creating its adapter"),
    "accelerate:kbit-other-device-raise": (
        rf'accelerate{_P}accelerator\.py", line (?:{"|".join(map(str, _ACCELERATE_OTHER_DEVICE_RAISE_LINES))}), in '
        r"prepare_model\s*\n[^\n]{0,60}?raise ValueError\(",
        "the traceback stops on accelerate prepare_model's refusal of a quantized model loaded on another device"),
    "offload": (r"param_offload|offload_param|offload_policy|cpu_offload|offload_params|CPUOffload|"
                r"offload_fsdp_model_to_cpu|load_fsdp_model_to_gpu", "weights are offloaded to the CPU"),
    # torch.compile's fake tensors print storage errors of their own (a custom kernel traced into).
    "compile": (rf"torch{_P}_dynamo|torch{_P}_inductor|FakeTensor|torch\.compile|opaque custom op",
                "torch.compile is in the traceback"),
    # Not DeepSpeed's own assertion (`... invalid for module in evaluation mode`): that line is the error itself,
    # and says nothing of what ran before it.
    "eval_mode": (r"\.eval\(\)|(?<!module in )evaluation mode|model\.training|\bEvaluation: +\d+%",
                  "a module's train/eval mode is involved (an evaluation loop ran)"),
    "shape_zero": (r"torch\.Size\(\[0\]\)|size of tensor [ab] \(0\)|shape \[0\]|\[0\]\)|numel\W{1,4}0\b",
                   "a tensor of size 0 (a released partition)"),
    # Not the words of DTensor's own refusal (`got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to
    # DTensor`): that message is the error, not a sign of what holds DTensors.
    "dtensor": (r"(?<!torch\.Tensor and )(?<!torch\.Tensor to )\bDTensor\b", "DTensor parameters are involved"),
    # The op DTensor's dispatcher names in `{op}: got mixed torch.Tensor and DTensor` (torch/distributed/tensor/
    # _dispatch.py; `{op}: got mixed distributed and non-distributed tensors.` in torch 2.0). An attention kernel
    # reads activations only: DTensor activations (a tensor- or context-parallel plan) met plain ones. A sharded
    # parameter left unsharded fails earlier, in the first op that reads a weight (aten.mm, aten.embedding).
    "dtensor:attention-op": (r"(?:flash_attn\w*\.\w+|aten\.(?:_scaled_dot_product\w+|scaled_dot_product_attention|"
                             r"_flash_attention\w*|_efficient_attention\w*|_cudnn_attention\w*))(?:\.default)?: got "
                             r"mixed (?:torch\.Tensor and DTensor|distributed and non-distributed tensors)",
                             "DTensor's refusal names an attention kernel: activations, not parameters, are DTensors"),
    "checkpoint_wrapper": (r"checkpoint_wrapper|CheckpointWrapper|activation_checkpointing\W{1,4}true",
                           "torch's checkpoint_wrapper (FSDP activation checkpointing) is in use"),
    "multi_forward": (r"\bdpo\b|chosen|rejected|concatenated_forward|\bkto\b|\borpo\b",
                      "a preference stage (chosen and rejected forwards)"),
    "dora_code": (rf"lora{_P}dora\.py|DoraLinearLayer|get_weight_norm", "DoRA's code is in the traceback"),
    "merge_frames": (_IN + r"(merge_and_unload|_unload_and_optionally_merge|merge_adapter|_fuse_lora|fuse_lora_weight|"
                     r"fuse_lora|merge_lora|get_delta_weight)\b|lora(/layer)?\.py\", line \d+, in merge\b",
                     "the traceback runs through a LoRA merge"),
    # accelerate's dispatch_model, called by from_pretrained itself to place a model loaded with a device_map: a
    # refusal to move a quantized model raised there comes from loading (a transformers/accelerate release pair that
    # do not agree on quantized models), not from a move or a merge after it.
    "load_dispatch": (r"big_modeling\.py\"?, line \d+, in dispatch_model\b|big_modeling\.py:\d+ in dispatch_model\b",
                      "the traceback runs through accelerate's dispatch_model while the model loads"),
    "generate_frames": (r"generation[/\\]utils\.py\", line \d+, in (generate|_sample|_greedy_search|sample)\b|"
                        + _IN + r"(generate|_generate|generate_completions|_generate_and_score_completions)\b",
                        "the traceback runs through generate()"),
    # torch's autograd engine on the traceback (its C++ entry from Python): the error was raised in a backward pass.
    "autograd_backward": (r"_execution_engine\.run_backward|in _engine_run_backward\b",
                          "the error is raised in the autograd backward pass"),
    "recompute_frames": (_IN + r"(recompute_fn|unpack_hook|_checkpoint_hook)\b|CheckpointFunction\.backward",
                         "the traceback runs through checkpoint's recompute"),
    "allgather_timeout": (r"_ALLGATHER|all_gather", "an all-gather is involved"),
    "reentrant_warning": (r"None of the inputs have requires_grad=True", "torch warned that a reentrant-checkpointed "
                          "segment got no input that requires grad"),
    "no_trainable": (r"trainable params: 0\b|No inf checks were recorded", "nothing in the model is trainable"),
    "no_target": (r"NoMatchingPeftModuleError|not found in the base model|No modules were targeted",
                  "PEFT found no module to adapt"),
    "adapter_loaded": (r"PeftModel\.from_pretrained|\.load_adapter\(|in load_adapter\b|is_trainable",
                       "a saved adapter is loaded through PEFT"),
    # A model other than the trained one runs in the step: a DPO/KTO reference, a distillation teacher, a reward
    # model, a diffusion pipeline's frozen text encoder (TRL dpo_trainer.py `concatenated_forward(self.ref_model`,
    # diffusers' train_text_to_image*.py `text_encoder(batch["input_ids"]`, encode_prompt).
    "second_model": (r"\bself\.ref_model\b|\bref_model\(|\bcompute_ref_log_probs\b|\bteacher(?:_model)?\(|"
                     r"\bself\.teacher\b|\btext_encoder(?:_\w+)?\(|\bencode_prompt\b|\breward_model\(",
                     "a reference, teacher or reward model, or a frozen text encoder, runs in the step"),
    # The project names a run's own training context: used to tell a training failure from a stray traceback.
    "training": (rf"\bpeft\b|\blora\b|deepspeed|accelerate|transformers{_P}|\btrainer\b|fsdp|fully_shard|"
                 r"gradient_checkpointing|"
                 r"\btrl\b|llamafactory|llama_factory|\bswift\b|openrlhf|axolotl|dschat|fine-?tun|gradient_accum|"
                 r"\bsft\b|\bdpo\b|\bppo\b|\bgrpo\b", "the log is from a training run"),
}

# Facts `explain` derives from the numbers in a message rather than from a pattern.
STRUCTURED_FACTS: dict[str, str] = {
    "meta:any": "the checkpoint's saved/recomputed metadata pairs are in the log",
    "meta:released-partition": "a recomputed tensor has shape [0] where the forward saved a full one: a parameter "
                               "partition released between forward and recompute (ZeRO-3)",
    "meta:precision-cast": "a recomputed tensor has the saved shape in another precision (half vs float32): a "
                           "mixed-precision cast skipped during recompute",
    "meta:cache-grown": "a recomputed tensor is longer along one dimension (doubled): a KV cache written again "
                        "during recompute",
    "meta:sequence-split": "a recomputed tensor is shorter along one dimension by a whole factor: the sequence "
                           "sharded across ranks (context/sequence parallelism) differs between forward and recompute",
    "meta:unexplained": "the metadata pairs differ in a way none of the known causes produces",
    "recompute:count": "the recompute saved a different number of tensors than the forward",
    "mismatch:doubled": "an elementwise op met one length twice the other (a sequence written twice)",
    "flatten:int": "FSDP was asked to flatten integer storage: uint8 (bitsandbytes' packed 4-bit default) or an "
                   "integer dtype the message does not name",
    "flatten:int-codes": "FSDP was asked to flatten signed integer weights (torch.int8/int32: LLM.int8 codes or "
                         "post-training quantization), not bitsandbytes' packed 4-bit storage (uint8)",
    "flatten:int32": "FSDP was asked to flatten int32 weights: the packed 4-bit codes of GPTQ and AWQ checkpoints",
    "flatten:half-and-float": "FSDP was asked to flatten a half-precision tensor beside a float32 one",
    "flatten:other": "FSDP was asked to flatten tensors of other mixed dtypes",
    "truncated": "the log stops inside a traceback, before the error line",
    "ddp:unused-not-vision": "DDP's reducer names the parameters that got no gradient, and none of them belongs to a "
                             "vision encoder or projector",
    "image-tokens:cut": "the text holds fewer image placeholder tokens than the image has features: the sequence was "
                        "cut inside an image's tokens",
    "image-tokens:other": "the text holds more image placeholder tokens than there are image features (a data or "
                          "processor mismatch, not a cut)",
}

FACT_NAMES = frozenset(FACTS) | frozenset(STRUCTURED_FACTS)
COMPILED_FACTS = {name: re.compile(pattern, re.IGNORECASE) for name, (pattern, _) in FACTS.items()}



# Messages and frames several rules share, declared once here and cited by each rule that prints them.
NO_GRAD_FN = r"element 0 of tensors does not require grad and does not have a grad_fn"
BNB_SHAPE = Message(r"shape '\[\d+, \d+\]' is invalid for input of size \d+", "shared",
                    "bitsandbytes dequantizing a 4-bit weight whose packed bytes are not what its quantization state "
                    "describes (repacked in place, or cast to another dtype)", "bitsandbytes 0.50.2 (seen)")
# transformers' refusals to move or cast a quantized model. Releases with the `is_quantized` check (4-bit support,
# 4.30 to the quantizer refactor) said `4-bit` or `8-bit` models, without `bitsandbytes`; those before 4-bit support
# said `8-bit` models only; `.half()` and `.float()` had their own wording before `You cannot cast ...`.
BNB_MOVED = Message(r"`?\.to`? is not supported for (`?4-bit`? or )?`?8-bit`? (bitsandbytes )?models", "shared",
                    "transformers/modeling_utils.py: PreTrainedModel.to (a quantized model moved after loading)")
BNB_CAST = Message(r"You cannot cast a bitsandbytes model in a new `?dtype`?|"
                   r"`?\.(half|float)\(\)`? is not supported for `?4-bit`? or `?8-bit`? models", "shared",
                   "transformers/modeling_utils.py: PreTrainedModel.to / half / float (a quantized model cast)")
ZERO_TRAINABLE = Message(r"trainable params: 0\b", "shared", "peft PeftModel.print_trainable_parameters")
REENTRANT_WARNING = r"None of the inputs have requires_grad=True"
RECOMPUTE_MESSAGES = (
    Message(r"Recomputed values for the following tensors have different metadata", "shared",
            "torch/utils/checkpoint.py: _checkpoint_hook / check_recomputed_tensors_match (non-reentrant, torch>=2.0)"),
    Message(r"recomputed metadata:", "shared", "the same error's per-tensor dump (its header may be cut off)"),
)
# The recompute saved another number of tensors: a code path taken on one pass only (a cache, a fused op,
# torch.compile). Many causes print it, so it counts only with facts that point at one.
RECOMPUTE_COUNT = Message(r"different number of tensors was saved during the original forward and recomputation|"
                          r"Number of tensors saved during (forward|recomputation)|trying to save more tensors during "
                          r"recomputation", "generic", "torch/utils/checkpoint.py: pack_hook / unpack_hook")
RECOMPUTE_FRAMES = (Message(r"checkpoint\.py:(check_recomputed_tensors_match|unpack_hook|unpack_hook_with_error_cb|"
                            r"recompute_fn|_checkpoint_hook)", "shared"),)
# The flat-parameter handle FSDP1 builds per unit: where its three flattening errors are raised.
FLAT_PARAM_FRAMES = (Message(r"_?flat_param\.py:(_validate_tensors_to_flatten|_init_flat_param|__init__|"
                             r"flatten_tensors_into_flat_param|_init_flat_param_and_metadata)$|"
                             r"_init_utils\.py:_init_param_handle_from_params$", "shared"),)
# FSDP's flattening refuses tensors of mixed dtypes; which mix (4-bit storage, float32 adapters) names the rule.
FLATTEN_DTYPE = Message(r"(Must flatten tensors|FlatParameter`? requires) (with )?uniform `?dtype|"
                        r"expects all parameters to have same dtype|FSDP expects uniform original parameter dtype",
                        "shared",
                        "FSDP1 _flat_param.py _validate_tensors_to_flatten (`FlatParameter` requires uniform dtype in "
                        "torch 1.13-2.0, an assert in 1.12); FSDP2 _fsdp_param_group.py _init_mp_dtypes")
# A ZeRO-3 placeholder of size 0 in an elementwise op: merging or DoRA's norm read the partitioned weight.
SIZE_ZERO_OPERAND = Message(r"size of tensor a \(0\) must match the size of tensor b \(\d+\)|"
                            r"size of tensor a \(\d+\) must match the size of tensor b \(0\)", "shared",
                            "an elementwise op on a ZeRO-3 placeholder")
_META = ("meta:released-partition", "meta:precision-cast", "meta:cache-grown", "meta:sequence-split")


def recompute_rivals(own: str) -> tuple[Evidence, ...]:
    """For a rule whose recompute mismatch shows as metadata verdict `own`: the other verdicts count against it."""
    rivals = tuple(Evidence(v, -8, f"{STRUCTURED_FACTS[v].split(':')[0]}, which points elsewhere")
                   for v in _META if v != own)
    return rivals + (Evidence("meta:unexplained", -4, "the metadata pairs differ in a way this cause does not "
                                                       "produce"),)
