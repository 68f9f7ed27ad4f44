"""The rules of DeepSpeed ZeRO and DDP (and of adapters under ZeRO-3: DoRA, QLoRA, merging); ids from the failure
catalog. The FSDP rules are in catalog_fsdp.py.

Version conditions live in `affected` (the registry compares them with the installed or given versions), so the
same rule answers for loraflow's own plan, for `check --versions`, and for `explain` when a log shows a version.
"""

from __future__ import annotations

from dataclasses import replace

from loraflow.rules.refusals import ZERO3_MULTI_ADAPTER
from loraflow.rules.rule import Rule, older, register
from loraflow.rules.signs import (
    BNB_SHAPE,
    FLAT_PARAM_FRAMES,
    FLATTEN_DTYPE,
    RECOMPUTE_FRAMES,
    RECOMPUTE_MESSAGES,
    SIZE_ZERO_OPERAND,
    Evidence,
    LogSigns,
    Message,
    recompute_rivals,
)

# ZeRO-3's coalesced all-gather took one dtype for all of a module's partitions before DeepSpeed 0.12.3
# (get_only_unique_item over p.dtype / p.ds_tensor.dtype). Any mix is refused: float32 adapters beside a half base
# (zero3-mixed-dtype-gather), or a 4-bit base's packed uint8 storage beside float weights (qlora-storage-dtype,
# axolotl#207). Which mix it was, the log's other lines say.
ZERO3_GATHER_DTYPES = Message(r"expected there to be only one unique element in <generator object .{0,80}"
                              r"all_gather_coalesced", "shared",
                              "deepspeed/runtime/zero/partition_parameters.py: all_gather_coalesced "
                              "(get_only_unique_item over the partitions' dtypes)", "deepspeed<0.12.3")
# Its successor (DeepSpeed PR #6993 to #8113, 0.17.2 to 0.19.2): with the config's torch_autocast a gather groups
# parameters by the dtype they travel in, then asserts each group shares one stored dtype, which a float32 adapter or
# a packed 4-bit weight beside half ones breaks.
ZERO3_GATHER_ONE_DTYPE = Message(r"all params must have the same dtype", "shared",
                                 "deepspeed/runtime/zero/partition_parameters.py: _all_gather_dtype",
                                 "deepspeed>=0.17.2,<0.19.3")


register(Rule(
    id="zero3-frozen-recompute",
    title="ZeRO-3 with frozen weights breaks non-reentrant checkpoint recompute",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-3, frozen base weights (LoRA, DoRA, QLoRA, frozen towers), non-reentrant "
               "checkpointing, deepspeed < 0.19.3",
    knobs=("reentrant", "input_grad_hook", "zero_stage"),
    affected={"deepspeed": "<0.19.3"},
    when=lambda s: s.zero3 and s.frozen_params and s.checkpointed and s.reentrant is False,
    cause=("ZeRO-3 re-partitions each parameter in place after use (param.data becomes an empty tensor). "
           "Non-reentrant checkpointing keeps a live reference to tensors that do not require grad, i.e. the "
           "frozen weights, so the recompute in backward sees shape [0] where the forward saw the full weight."),
    fix=("loraflow switches to reentrant checkpointing with the embedding-output hook on deepspeed < 0.19.3 "
         "(or upgrade deepspeed, or use zero_stage 2)."),
    remedy=lambda s: {"reentrant": True},
    elsewhere="upgrade to deepspeed>=0.19.3; else use reentrant checkpointing plus enable_input_require_grads(); "
              "else ZeRO-2",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/8148",),
    fixed_in="deepspeed 0.19.3 (PR #8148)",
    log=LogSigns(
        messages=RECOMPUTE_MESSAGES,
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("meta:released-partition", 8, "a recomputed tensor has shape [0] where the forward saved a "
                           "full one: a ZeRO-3 partition released in between", decisive=True, alone=True),
                  *recompute_rivals("meta:released-partition"),
                  Evidence("zero3_hooks", 3, "ZeRO-3 parameter code is in the traceback"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("deepspeed", 1, "DeepSpeed is in use"),
                  Evidence("peft", 1, "frozen base weights (an adapter)")),
        prior=4.0,
        tells_apart="DeepSpeed ZeRO-3 with frozen weights (LoRA, a frozen tower) and non-reentrant checkpointing on "
                    "deepspeed < 0.19.3; the recomputed shapes read torch.Size([0])"),
))

register(Rule(
    id="zero3-eval-backward",
    title="Backward through a ZeRO-3 module left in eval mode",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-3, backward through a module whose .training is False (policy left in eval after "
               "generation), deepspeed <= 0.15.3",
    knobs=("train_mode_at_backward",),
    affected={"deepspeed": "<=0.15.3"},
    when=lambda s: s.zero3 and not s.train_mode_at_backward,
    cause=("ZeRO-3's pre- and post-backward hooks asserted module.training. RLHF code that puts the policy in eval "
           "mode to generate and computes the loss without switching back hits the assertion in backward."),
    fix="loraflow calls train() on the policy before every loss and asserts it before backward; reference and "
        "reward models run under no_grad.",
    remedy=lambda s: {"train_mode_at_backward": True},
    elsewhere="call model.train() before the loss; upgrade to deepspeed>=0.15.4",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/6662",),
    fixed_in="deepspeed 0.15.4 (assert removed, PR #6662)",
    symptoms=("eval-mode-at-backward",),
    log=LogSigns(
        messages=(Message(r"backward pass is invalid for module in evaluation mode", "own",
                          "deepspeed/runtime/zero/parameter_offload.py: pre/post backward hooks (deepspeed<=0.15.3)"),),
        frames=(Message(r"parameter_offload\.py:(_run_before_backward_function|_post_backward_module_hook|"
                        r"_pre_backward_module_hook|pre_sub_module_backward_function|backward|"
                        r"post_sub_module_backward_function|_run_after_backward_function)$", "own"),
                # DeepSpeed's backward entry: many failures pass through it, so only facts can point here.
                Message(r"runtime/engine\.py:backward$|zero/stage3\.py:backward$|accelerator\.py:backward$",
                        "generic")),
        evidence=(Evidence("rlhf", 1, "an RLHF stage (generation in eval mode) runs"),
                  Evidence("eval_mode", 2, "an evaluation or generation ran in eval mode just before"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"))),
))

register(Rule(
    id="zero3-eval-trace",
    title="DeepSpeed <= 0.15.3 ZeRO-3 fails the first evaluation after training steps",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with an evaluation set (eval-mode forwards before and after the training steps, "
               "loss-only ones included), deepspeed < 0.15.4",
    knobs=("zero_stage", "evaluates"),
    affected={"deepspeed": "<0.15.4"},
    when=lambda s: s.zero3 and s.evaluates,
    cause=("ZeRO-3 keeps a separate prefetch trace for eval-mode forwards. DeepSpeed <= 0.15.3 records it in the "
           "evaluation before training and compares the evaluation after the steps against it; the training steps "
           "in between leave the module order other than recorded, and the forward fails with `tracing error at "
           "step N: expected the next 1 parameters in the parameter fetch queue` (the composition sweep found it "
           "with a loss-only reward-model evaluation; the probe reproduces it)."),
    fix=("upgrade to deepspeed>=0.19.2, or train without an evaluation set (data.eval= and data.eval_fraction=0), "
         "or use ZeRO-2 (parallel.zero_stage=2) or FSDP2 (parallel.engine=fsdp2)"),
    elsewhere="upgrade DeepSpeed, or evaluate outside the ZeRO-3 run",
    # #1901 gave eval-mode forwards their own trace; #3599 collects the "parameter fetch queue" crashes.
    references=("https://github.com/deepspeedai/DeepSpeed/issues/3599",
                "https://github.com/deepspeedai/DeepSpeed/pull/1901"),
    fixed_in="not seen on deepspeed 0.19.1 and later; 0.15.4 to 0.19.0 were not run with a loss-only evaluation",
    log=LogSigns(
        messages=(Message(r"tracing error at step \d+", "shared", "deepspeed runtime/zero/partitioned_param_"
                          "coordinator.py: fetch_sub_module, a module order other than the recorded trace"),),
        evidence=(Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("eval_mode", 3, "an evaluation ran after training steps"),
                  Evidence("generation", -1, "generation between steps points to zero3-stale-trace")),
        prior=1.0,
    ),
))

register(Rule(
    id="zero3-stale-trace",
    title="ZeRO-3's prefetch trace goes stale when the model also runs outside its training steps",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with forwards of the trained model outside its training steps (generation in an "
               "evaluation or a rollout, a reference or values scored through it), deepspeed < 0.19.2",
    knobs=("zero_stage", "outside_forwards"),
    affected={"deepspeed": "<0.19.2"},
    # Generation with ZeRO-3's hooks lifted for one gather (TRL's ds3_gather_for_generation, loraflow's rollout
    # gather) records no trace; generation through the hooks does.
    when=lambda s: s.zero3 and (s.outside_forwards or (s.generation and not s.generation_gather)),
    cause=("ZeRO-3 records the order in which modules fetch their parameters and prefetches by it. A forward "
           "outside the training step (no backward, another module order) invalidates that trace, but DeepSpeed "
           "kept the stale per-module fetch records, so the next forward that rebuilds the trace pops an empty "
           "queue: `IndexError: pop from an empty deque` in record_parameters (0.15.4 to 0.19.1: loraflow runs hit "
           "it after an evaluation that generates, with DPO's reference copy, and in PPO; the probe reproduces it). "
           "DeepSpeed <= 0.15.3 traced eval-mode forwards apart and failed with `tracing error at step N: expected "
           "the next 1 parameters in the parameter fetch queue` (SFT with evaluation, DPO, GRPO). Some such runs "
           "survive a few steps; which ones depends on DeepSpeed's bookkeeping, so none is accepted."),
    fix=("upgrade to deepspeed>=0.19.2, or use ZeRO-2 (parallel.zero_stage=2) or FSDP2 (parallel.engine=fsdp2); "
         "SFT without exact-match evaluation (eval.generate=false: a loss-only evaluation) trains on 0.15.4 to "
         "0.19.1 (not on 0.15.3: zero3-eval-trace)."),
    elsewhere="upgrade to deepspeed>=0.19.2; else ZeRO-2, or train without evaluation and generation under ZeRO-3",
    references=("https://github.com/huggingface/trl/issues/4899", "https://github.com/huggingface/accelerate/issues/3386",
                "https://github.com/huggingface/trl/pull/4693"),
    fixed_in="deepspeed 0.19.2 (the invalidated trace clears its fetch records)",
    log=LogSigns(
        messages=(Message(r"pop from an empty deque", "generic", "deepspeed runtime/zero/partitioned_param_coordinator"
                          ".py: record_parameters (deepspeed 0.15.4 to 0.19.1)"),
                  Message(r"tracing error at step \d+", "shared", "deepspeed runtime/zero/partitioned_param_"
                          "coordinator.py: fetch_sub_module, a module order other than the recorded trace")),
        frames=(Message(r"partitioned_param_coordinator\.py:(record_parameters|construct_parameter_trace_from_module_"
                        r"trace)$", "own"),),
        evidence=(Evidence("zero3_hooks", 4, "ZeRO-3's trace code is in the traceback", decisive=True),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("generation", 2, "the model generates between training steps"),
                  Evidence("eval_mode", 2, "an evaluation ran between training steps"),
                  Evidence("rlhf", 1, "an RLHF stage (rollouts, reference scoring) runs"),
                  Evidence("vision", -2, "an image-text model: ranks skipping the vision tower change the order too "
                           "(zero3-vision-skipped)")),
        prior=2.0,
        tells_apart="ZeRO-3 on deepspeed < 0.19.2 with evaluation or generation between training steps; the "
                    "IndexError's traceback runs through _start_of_forward_hook, reset_step and record_parameters"),
))

register(Rule(
    id="zero3-empty-adapter-save",
    title="ZeRO-3 adapter saved without gathering its partitions",
    verdict="fix",
    impact="silent",
    conditions="DeepSpeed ZeRO-3, adapter saved from the module's state_dict without gathering the partitions",
    knobs=("adapter_save_gather",),
    when=lambda s: s.zero3 and s.adapter != "full" and not s.adapter_save_gather,
    cause=("Under ZeRO-3 each rank holds only a partition of every parameter; the module's own tensors are empty "
           "placeholders between uses. Saving them without gathering writes empty or zero adapter tensors with no "
           "error; the failure shows only when the adapter is loaded or used."),
    fix="loraflow gathers only the trainable (adapter) parameters before writing them.",
    remedy=lambda s: {"adapter_save_gather": True},
    elsewhere="set stage3_gather_16bit_weights_on_model_save=true, or gather with "
              "deepspeed.zero.GatheredParameters before save_pretrained; transformers >= 5.0 Trainer does it",
    references=("https://github.com/huggingface/peft/issues/2892",
                "https://github.com/huggingface/trl/issues/4416"),
    fixed_in="transformers 5.0.0 for Trainer users",
    log=LogSigns(
        messages=(Message(r"size mismatch for .{0,300}lora_[AB].{0,300}torch\.Size\(\[0\]\)", "own",
                          "torch Module.load_state_dict on a saved adapter"),
                  Message(r"copying a param with shape torch\.Size\(\[0\]\)", "own", "load_state_dict"),
                  Message(r"size mismatch for", "generic", "load_state_dict")),
        evidence=(Evidence("shape_zero", 4, "a saved tensor has size 0: an ungathered ZeRO-3 partition",
                           decisive=True),
                  Evidence("peft", 2, "adapter tensors are named"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"))),
))

register(Rule(
    id="zero3-generation-gather",
    title="ZeRO-3 generation gathers the weights at every decoding step",
    verdict="fix",
    impact="slow",
    conditions="DeepSpeed ZeRO-3 and generate() on the trained model (GRPO/PPO rollouts) without gathering once "
               "per rollout",
    knobs=("generation_gather",),
    when=lambda s: s.zero3 and s.generation and not s.generation_gather,
    cause=("Each decoding step is a full forward, and ZeRO-3 all-gathers every layer's parameters for each one, so "
           "generation runs 10-100x slower; ranks that finish early stop joining the gathers and the others hang "
           "unless synced_gpus=True."),
    fix="loraflow gathers the parameters once per rollout (GatheredParameters, with DeepSpeed's per-module "
        "fetch/release hooks lifted meanwhile), so decoding runs no collective at all.",
    remedy=lambda s: {"generation_gather": True},
    elsewhere="gather once per rollout (TRL's unwrap_model_for_generation, OpenRLHF/ms-swift vLLM engines), and "
              "pass synced_gpus=True when generating from a sharded model",
    references=("https://github.com/huggingface/trl/pull/1483",
                "https://github.com/huggingface/transformers/issues/18281"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Watchdog caught collective operation timeout|collective operation timeout", "generic",
                          "torch ProcessGroupNCCL watchdog"),),
        frames=(Message(r"generation/utils\.py:(generate|_sample|_greedy_search|sample)$|:generate$", "generic"),),
        evidence=(Evidence("generation", 2, "generation runs"),
                  Evidence("generate_frames", 2, "the run stopped inside generate()"),
                  Evidence("fsdp2", -3, "FSDP2 is in use, which points at its own generation rule"),
                  Evidence("allgather_timeout", 2, "an all-gather timed out"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"))),
))

register(Rule(
    id="dora-sharded-weight",
    title="DoRA reads a sharded base weight for its norm",
    verdict="fix",
    impact="crash",
    conditions="DoRA under ZeRO-3, or under FSDP1 (flat parameters) with peft < 0.12, base weight not gathered for "
               "the norm",
    knobs=("dora_weight_gather", "engine"),
    boundaries={"peft": ("0.12",)},
    when=lambda s: (s.adapter == "dora" and not s.dora_weight_gather
                    and (s.zero3 or (s.flat_params and older(s, "peft", "0.12")))),
    cause=("DoRA computes a per-column norm of the base weight outside the base layer's forward. Under FSDP1 that "
           "weight is a flattened shard and under ZeRO-3 an empty partition or 1-D slice, so the norm's shapes "
           "do not fit."),
    fix="loraflow gathers the base weight for DoRA's norm (GatheredParameters), or shards with FSDP2.",
    remedy=lambda s: {"dora_weight_gather": True},
    elsewhere="use LoRA, or FSDP2 with per-parameter sharding, or ZeRO-2",
    references=("https://github.com/huggingface/peft/issues/1731", "https://github.com/huggingface/peft/issues/1737",
                "https://github.com/huggingface/peft/pull/1806"),
    fixed_in="peft 0.12.0 for FSDP (PR #1806); not fixed for ZeRO-3",
    log=LogSigns(
        messages=(Message(r"IndexError: tuple index out of range", "generic", "peft DoRA weight norm"),
                  Message(r"mat1 and mat2 shapes cannot be multiplied", "generic", "peft DoRA"),
                  SIZE_ZERO_OPERAND),
        frames=(Message(r"lora[/\\]dora\.py:|:get_weight_norm|:_get_weight_norm|DoraLinearLayer", "own"),),
        evidence=(Evidence("dora_code", 5, "DoRA's code is in the traceback", decisive=True),
                  Evidence("dora", 2, "DoRA is in use"),
                  Evidence("autograd_backward", -2, "the error is raised in a backward pass (DoRA reads its base "
                           "weight's norm in the forward, or its recompute)"),
                  Evidence("fsdp", 1, "FSDP is in use"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"))),
))

register(Rule(
    id="qlora-storage-dtype",
    title="4-bit storage dtype differs from the dtype the engine shards",
    verdict="fix",
    impact="crash",
    conditions="QLoRA (bitsandbytes 4-bit) under FSDP or ZeRO-3 with bnb_4bit_quant_storage unlike the model dtype",
    knobs=("quant_storage_matches",),
    when=lambda s: s.quantization == "4bit" and s.sharded_params and not s.quant_storage_matches,
    cause=("bitsandbytes stores 4-bit weights packed in uint8 by default. FSDP1 flattens a unit's parameters into "
           "one tensor of one dtype and refuses integer storage; and a packed weight stored in a float dtype other "
           "than the model's is cast like a real weight by FSDP2's or DeepSpeed's bf16 settings, which garbles it "
           "(bitsandbytes then fails to dequantize: `shape '[128, 64]' is invalid for input of size 4096`, seen "
           "on torch 2.13, deepspeed 0.19.8, bitsandbytes 0.50.2)."),
    fix="loraflow sets bnb_4bit_quant_storage to the model's dtype.",
    remedy=lambda s: {"quant_storage_matches": True},
    elsewhere="BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16) (the model's dtype)",
    references=("https://huggingface.co/docs/peft/accelerate/fsdp",
                "https://github.com/huggingface/transformers/pull/29587",
                "https://github.com/axolotl-ai-cloud/axolotl/issues/207 (ZeRO-3's one-dtype gather, deepspeed<0.12.3)"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Cannot flatten integer dtype tensors", "own",
                          "torch/distributed/fsdp/_flat_param.py: _validate_tensors_to_flatten", "torch>=2.1"),
                  Message(r"Integer parameters are unsupported", "own", "torch/distributed/fsdp/flat_param.py",
                          "torch>=1.13,<2.1"),
                  Message(r"non-floating frozen Params4bit", "warning", "accelerate fsdp_utils.py fsdp2_prepare_model "
                          "(excludes them from sharding)", "accelerate>=1.14"),
                  FLATTEN_DTYPE, BNB_SHAPE, replace(ZERO3_GATHER_DTYPES, kind="generic"),
                  replace(ZERO3_GATHER_ONE_DTYPE, kind="generic"),
                  # FSDP2 makes each local shard a new nn.Parameter (requires_grad=True by default) before it
                  # restores the original flag: uint8 storage cannot (accelerate issue 3983).
                  Message(r"only Tensors of floating point dtype can require gradients", "generic",
                          "torch/distributed/fsdp/_fully_shard/_fsdp_param.py: FSDPParam._init_sharded_param")),
        frames=FLAT_PARAM_FRAMES,
        evidence=(Evidence("flatten:int", 8, "the flattened tensors include integer (packed 4-bit) storage",
                           decisive=True, alone=True),
                  # 8-bit codes or int8/int32 post-training quantization: not the 4-bit storage this rule sets.
                  Evidence("flatten:int-codes", -8, "signed integer weights (8-bit codes or post-training "
                           "quantization), not bitsandbytes' packed 4-bit (uint8) storage", excludes=True),
                  Evidence("flatten:other", 4, "two half-precision types: 4-bit storage in a dtype unlike the "
                           "model's"),
                  Evidence("flatten:half-and-float", -6, "a half tensor beside a float32 one: mixed parameter "
                           "dtypes, not 4-bit storage"),
                  Evidence("quant4bit", 3, "a 4-bit base is in use"),
                  Evidence("fsdp", 2, "FSDP is in use: its bf16 policy casts float-stored 4-bit weights"),
                  Evidence("fsdp2", 2, "FSDP2 (fully_shard) re-creates each weight as a parameter that requires "
                           "grad, which packed uint8 storage cannot"),
                  Evidence("input_grad_hook", -8, "an input-requires-grad hook asked an integer activation to "
                           "require grad, not a sharded weight", excludes=True),
                  Evidence("bnb:cpu-repack", -8, "bitsandbytes' CPU repack prints the same shape error")),
        prior=1.5,
        tells_apart="a 4-bit (bitsandbytes) base under FSDP without bnb_4bit_quant_storage set to the model dtype; "
                    "the dtypes in the message include uint8"),
))

register(Rule(
    id="zero3-lora-merge",
    title="LoRA merged into ZeRO-3-partitioned base weights",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 and adapter weights merged into the base weights while they are partitioned "
               "(merge_and_unload before saving or for inference, a hybrid engine fusing LoRA for generation)",
    knobs=("merge_in_sharded", "zero_stage"),
    when=lambda s: s.zero3 and s.merge_in_sharded,
    cause=("Under ZeRO-3 a module's weight is an empty placeholder (shape [0]) or a 1-D slice between uses; only "
           "the forward's hooks gather it. Merging adds the LoRA product B @ A (out x in) onto that placeholder, so "
           "the shapes do not fit (`size of tensor a (4096) must match the size of tensor b (0)`), or, where a "
           "gathered copy is written back in the wrong layout, the merge is silently wrong."),
    fix="loraflow never merges during training: it saves the adapter, and `loraflow merge` folds it into the whole "
        "base in one process afterwards.",
    remedy=lambda s: {"merge_in_sharded": False},
    elsewhere="save the adapter and merge offline in one process, or gather first: with "
              "deepspeed.zero.GatheredParameters(list(model.parameters())) around merge_and_unload; DeepSpeed-Chat: "
              "no --enable_hybrid_engine with LoRA under ZeRO-3",
    references=("https://github.com/huggingface/peft/issues/297", "https://github.com/huggingface/peft/pull/2446",
                "https://github.com/hiyouga/LlamaFactory/issues/2081",
                "https://github.com/deepspeedai/DeepSpeedExamples/issues/337"),
    fixed_in="not fixed upstream (PEFT's DeepSpeed guide: merging under ZeRO-3 is unsupported)",
    log=LogSigns(
        messages=(Message(r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)", "generic",
                          "peft LoraLayer.merge / merge_and_unload, DeepSpeed hybrid engine _fuse_lora"),
                  Message(r"mat1 and mat2 shapes cannot be multiplied", "generic", "get_delta_weight"),
                  SIZE_ZERO_OPERAND,
                  ZERO3_MULTI_ADAPTER),  # LLaMA-Factory's refusal to merge adapters under ZeRO-3 (refusals.py)
        frames=(Message(r":(merge_and_unload|_unload_and_optionally_merge|merge_adapter|_fuse_lora|fuse_lora_weight|"
                        r"fuse_lora|merge_lora)$", "own"),
                Message(r"lora(/layer)?\.py:(merge|get_delta_weight)$", "own")),
        evidence=(Evidence("autograd_backward", -6, "the error is raised in a backward pass, where no merge runs",
                           excludes=True),
                  Evidence("merge_frames", 5, "the traceback runs through a LoRA merge", decisive=True),
                  Evidence("merge", 2, "adapter weights are merged"),
                  Evidence("shape_zero", 2, "a tensor of size 0 (a ZeRO-3 placeholder)"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("deepspeed", 1, "DeepSpeed is in use")),
        prior=2.0,
        tells_apart="merge_and_unload (or a hybrid engine's LoRA fuse) runs while DeepSpeed ZeRO-3 holds the model"),
))

register(Rule(
    id="zero3-mixed-dtype-gather",
    title="ZeRO-3 gathers float32 adapters and half-precision base weights in one collective",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with trainable float32 adapters beside a bf16/fp16 base (PEFT's "
               "autocast_adapter_dtype, or LoRA created after a half-precision zero.Init), deepspeed < 0.12.3 or "
               "deepspeed 0.19.2",
    knobs=("mixed_param_dtypes", "zero_stage"),
    affected={"deepspeed": "<0.12.3 || ==0.19.2"},
    when=lambda s: s.zero3 and s.mixed_param_dtypes,
    cause=("ZeRO-3 all-gathers a module's partitions in coalesced buckets whose buffer takes one dtype. Before "
           "DeepSpeed 0.12.3 the bucket refused mixed dtypes outright (`expected there to be only one unique "
           "element`); 0.19.2 stopped casting every parameter to bf16 and sized the output buffers by the first "
           "parameter's dtype (`output tensor must have the same type as input tensor`)."),
    fix="loraflow refuses ZeRO-3 with mixed parameter dtypes on these DeepSpeed releases: upgrade DeepSpeed.",
    elsewhere="upgrade deepspeed (>=0.12.3, and not 0.19.2); else keep adapters in the base dtype "
              "(get_peft_model(..., autocast_adapter_dtype=False)) or load the base in float32",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/4647", "https://github.com/deepspeedai/DeepSpeed/issues/8072",
                "https://github.com/deepspeedai/DeepSpeed/pull/8073", "https://github.com/huggingface/trl/pull/6091",
                "https://github.com/bigcode-project/starcoder/issues/96"),
    fixed_in="deepspeed 0.12.3 (PR #4647); regressed in 0.19.2, fixed again in 0.19.3 (PR #8073)",
    log=LogSigns(
        messages=(ZERO3_GATHER_DTYPES, ZERO3_GATHER_ONE_DTYPE,
                  Message(r"output tensor must have the same type as input tensor", "shared",
                          "torch.distributed all_gather_into_tensor from ZeRO-3's _allgather_params_coalesced")),
        frames=(Message(r"partition_parameters\.py:(all_gather_coalesced|_allgather_params_coalesced)$", "shared"),),
        evidence=(Evidence("zero3_hooks", 3, "ZeRO-3 parameter code is in the traceback"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("fsdp_optim_state", -6, "FSDP gathers an optimizer's state: the gather is not ZeRO-3's "
                           "(rule fsdp1-8bit-optimizer-save)", excludes=True),
                  Evidence("peft", 2, "adapters (float32 by default) train on a half-precision base"),
                  Evidence("half", 1, "half precision is in use"),
                  Evidence("quant4bit", -8, "a 4-bit base: its packed (uint8) storage is the odd dtype in the gather "
                           "(qlora-storage-dtype)")),
        prior=1.0,
        tells_apart="ZeRO-3 with LoRA on a bf16/fp16 base and no 4-bit base; the traceback runs through "
                    "partition_parameters.py's coalesced all-gather"),
))

register(Rule(
    id="bf16-zero-master-weights",
    title="Pure bf16 under DeepSpeed ZeRO trains with fp32 master weights anyway",
    verdict="error",
    impact="silent",
    conditions="pure bf16 (weights, gradients and optimizer state stored in bfloat16) with DeepSpeed ZeRO stage 1, 2 "
               "or 3",
    knobs=("precision", "zero_stage", "engine"),
    when=lambda s: s.engine_spec.zero and s.sharded_optimizer and s.precision == "bf16",
    cause=("DeepSpeed's ZeRO optimizers keep fp32 master copies of the trained weights and reduce and apply fp32 "
           "gradients whatever dtype the model is stored in (bf16 masters only as an opt-in of recent releases, "
           "bf16_master_weights_and_grads, tied to ZeRO-Offload, which loraflow does not set). A run configured "
           "for pure bf16 therefore trains as bf16-mixed: no error, but other updates than the same config on one "
           "process or under FSDP2, and not the memory pure bf16 was chosen for."),
    fix="loraflow refuses it: use precision.mode=bf16-mixed (what ZeRO runs anyway), or parallel.zero_stage=0, or "
        "parallel.engine=fsdp2.",
    elsewhere="train bf16 mixed (fp32 master weights, what ZeRO runs anyway), or shard with FSDP to keep pure bf16",
    references=("deepspeed/runtime/zero/stage_1_and_2.py: single_partition_of_fp32_groups (fp32 master partitions)",
                "deepspeed/runtime/zero/stage3.py: fp32_partitioned_groups_flat (fp32 master partitions)",
                "LLaMA-Factory hparams/parser.py: `pure_bf16` is incompatible with DeepSpeed ZeRO-3"),
    fixed_in="design (ZeRO's optimizers keep fp32 master weights)",
    log=LogSigns(
        messages=(Message(r"pure_bf16.{0,2} is incompatible with DeepSpeed ZeRO-3", "own",
                          "LLaMA-Factory hparams/parser.py: get_train_args (its own refusal)"),),
        tells_apart="pure bf16 asked for (LLaMA-Factory pure_bf16, a model cast to bf16 with no autocast) while "
                    "DeepSpeed ZeRO 1-3 holds the optimizer"),
))


register(Rule(
    id="sharded-tied-adapters",
    title="Adapters tied across tied embeddings cannot be sharded",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO (stage 1-3) or FSDP with adapters (LoRA/DoRA) on a model whose embeddings and "
               "output head are tied (tie_word_embeddings=True), with lm_head trained",
    knobs=("engine", "zero_stage", "tied_embeddings", "lm_head_trainable"),
    when=lambda s: (s.tied_embeddings and s.adapter != "full" and s.lm_head_trainable
                    and s.sharded_optimizer),
    cause=("Trained copies of tied embeddings must stay tied (rule tied-embedding-adapter), and PEFT ties them by "
           "making the output head's adapter matrices transposed views of the embedding adapter's "
           "(peft/tuners/lora/model.py, tied_adapter: lora_A = emb_B.t()): two parameters over one storage, one "
           "of them non-contiguous. A sharding engine copies each parameter into its own flat or sharded buffer: "
           "FSDP2 refuses the non-contiguous one (`NotImplementedError: FSDP does not support non-contiguous "
           "parameters yet`), DeepSpeed 0.19 cannot view it as bytes (`self.stride(-1) must be 1 to view Float "
           "as Byte`), and DeepSpeed 0.15.3 trains the two copies apart, so the saved adapter's head and "
           "embedding no longer agree (the composition sweep, on Gemma, Gemma3 and PaliGemma, which tie by "
           "default; torch 2.13, peft 0.21)."),
    fix="Use parallel.engine=ddp (or one process), or leave lm_head out of adapter.target_modules and "
        "adapter.train_modules on this tied model (an adapter on embed_tokens alone is not tied to the head).",
    elsewhere="don't adapt the tied output head when sharding, or untie the embeddings (tie_word_embeddings=False, "
              "which changes the model)",
    references=("https://github.com/huggingface/peft/pull/2879 (adapters on tied embeddings, ensure_weight_tying)",
                "torch/distributed/fsdp/_fully_shard/_fsdp_param.py (non-contiguous parameters refused)"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"FSDP does not support non-contiguous parameters", "own",
                          "torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "torch 2.13 (seen)"),
                  Message(r"must be 1 to view Float as Byte", "shared",
                          "deepspeed flattening a non-contiguous parameter", "deepspeed 0.19 (seen)")),
        tells_apart="a non-contiguous parameter where the engine flattens or shards: PEFT's transposed tied "
                    "adapters on lm_head"),
))

