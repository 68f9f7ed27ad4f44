"""The rules of sharded and distributed engines: DeepSpeed ZeRO, FSDP1/FSDP2, DDP; ids from the failure catalog.

Version conditions live in `affected` (the registry compares them with the installed or given versions), so the
same rule answers for loraflow's own plan, for `check --versions`, and for `explain` when a log shows a version.
"""

from __future__ import annotations

from packaging.version import Version

from loraflow.rules.registry import Rule, register
from loraflow.rules.setup import Setup
from loraflow.rules.signs import (FLAT_PARAM_FRAMES, RECOMPUTE_FRAMES, RECOMPUTE_MESSAGES, SIZE_ZERO_OPERAND, Evidence,
                                  LogSigns, Message, recompute_rivals)

# FSDP1's flattening refuses tensors of mixed dtypes; which mix (4-bit storage, float32 adapters) names the rule.
FLATTEN_DTYPE = Message(r"(Must flatten tensors|FlatParameter`? requires) (with )?uniform `?dtype|"
                        r"expects all parameters to have same dtype|FSDP expects uniform original parameter dtype",
                        "shared",
                        "FSDP1 _flat_param.py _validate_tensors_to_flatten (`FlatParameter` requires uniform dtype in "
                        "torch 1.13-2.0, an assert in 1.12); FSDP2 _fsdp_param_group.py _init_mp_dtypes")

def _checkpointed(s: Setup) -> bool:
    return s.checkpointing != "off"


def _older(s: Setup, package: str, fixed: str) -> bool:
    """For a version condition on one branch of a rule only; unknown counts as affected, like `affected`."""
    version = s.version(package)
    return version is None or version < Version(fixed)


register(Rule(
    id="zero3-frozen-recompute",
    title="ZeRO-3 with frozen weights breaks non-reentrant checkpoint recompute",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-3, frozen base weights (LoRA, DoRA, QLoRA, frozen towers), non-reentrant "
               "checkpointing, deepspeed < 0.19.3",
    knobs=("reentrant", "input_grad_hook", "zero_stage"),
    affected={"deepspeed": "<0.19.3"},
    when=lambda s: s.zero3 and s.frozen_params and _checkpointed(s) and s.reentrant is False,
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
    id="fsdp2-recompute-cast",
    title="FSDP2 mixed precision skipped its casts during checkpoint recompute",
    verdict="fix",
    impact="crash",
    conditions="FSDP2 with a MixedPrecisionPolicy (bf16/fp16), checkpoint wrapper placed outside the sharded "
               "unit, torch < 2.13 (LoRA and DoRA alike)",
    knobs=("checkpoint_outside_shard", "precision"),
    affected={"torch": "<2.13"},
    when=lambda s: s.engine == "fsdp2" and _checkpointed(s) and s.half_precision and s.checkpoint_outside_shard,
    cause=("FSDP2 casts a unit's inputs and outputs to the policy's dtype in its forward hooks. When the "
           "checkpoint wraps the sharded unit from outside, the recompute in backward ran without those casts, so "
           "recomputed tensors came back in a different dtype than the forward saved."),
    fix="loraflow applies checkpointing inside each sharded unit (wrap, then fully_shard) and keeps layer inputs in "
        "the parameter dtype.",
    remedy=lambda s: {"checkpoint_outside_shard": False},
    elsewhere="upgrade to torch>=2.13; else apply the checkpoint wrapper before fully_shard",
    references=("https://github.com/pytorch/pytorch/pull/182580",),
    fixed_in="torch 2.13.0 (PR #182580)",
    log=LogSigns(
        messages=RECOMPUTE_MESSAGES + (Message(r"Expected query, key, and value to have the same dtype", "generic",
                                               "torch scaled_dot_product_attention (recompute in another dtype)"),),
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("meta:precision-cast", 8, "a recomputed tensor has the saved shape in another precision: "
                           "a mixed-precision cast skipped during recompute", decisive=True, alone=True),
                  *recompute_rivals("meta:precision-cast"),
                  Evidence("fsdp2", 3, "FSDP2 is in use"),
                  Evidence("fsdp", 1, "FSDP is in use"),
                  Evidence("zero3", -2, "ZeRO-3 is in use, a more common cause of this error")),
        prior=1.5,
        tells_apart="FSDP2 with a bf16/fp16 MixedPrecisionPolicy and the checkpoint wrapper applied around the "
                    "sharded module on torch < 2.13; the recomputed dtype differs while the shape is the same"),
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
    log=LogSigns(
        messages=(Message(r"backward pass is invalid for module in evaluation mode", "own",
                          "deepspeed/runtime/zero/parameter_offload.py: pre/post backward hooks (deepspeed<=0.15.3)"),),
        frames=(Message(r"parameter_offload\.py:(_run_before_backward_function|_post_backward_module_hook|"
                        r"_pre_backward_module_hook|pre_sub_module_backward_function|backward|"
                        r"post_sub_module_backward_function|_run_after_backward_function)$", "own"),),
        evidence=(Evidence("rlhf", 1, "an RLHF stage (generation in eval mode) runs"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"))),
))

register(Rule(
    id="ddp-reentrant-unused",
    title="DDP counts reentrant recompute's parameter hooks twice",
    verdict="fix",
    impact="crash",
    conditions="DDP, reentrant checkpointing, find_unused_parameters=True, no static graph",
    knobs=("find_unused_parameters", "reentrant", "ddp_static_graph"),
    when=lambda s: (s.engine == "ddp" and _checkpointed(s) and s.reentrant is True and s.find_unused_parameters
                    and not s.ddp_static_graph),
    cause=("Reentrant checkpointing runs a second autograd pass in backward that fires each parameter's gradient "
           "hook again. DDP with find_unused_parameters=True marks a parameter ready per hook and refuses the "
           "second mark. The HF Trainer turns find_unused_parameters on for PEFT models with checkpointing."),
    fix="loraflow wraps DDP with find_unused_parameters=False: every adapter is used in every forward.",
    remedy=lambda s: {"find_unused_parameters": False},
    elsewhere="ddp_find_unused_parameters=False, or non-reentrant checkpointing, or static_graph=True",
    references=("https://github.com/huggingface/transformers/issues/23018",
                "https://github.com/pytorch/pytorch/issues/24005",
                "https://github.com/huggingface/accelerate/issues/2017"),
    fixed_in="not a bug: configuration",
    log=LogSigns(
        messages=(Message(r"Expected to mark a variable ready only once", "own",
                          "torch/csrc/distributed/c10d/reducer.cpp: mark_variable_ready"),
                  Message(r"has been marked as ready twice|marked as ready twice", "own",
                          "reducer.cpp (names the parameter, with TORCH_DISTRIBUTED_DEBUG)")),
        evidence=(Evidence("find_unused", 2, "DDP's unused-parameter search is on"),
                  Evidence("checkpointing", 1, "checkpointing is in use"),
                  Evidence("reentrant", 1, "reentrant checkpointing is named"))),
))

register(Rule(
    id="fsdp1-mixed-requires-grad",
    title="FSDP1 cannot flatten frozen and trainable weights into one unit",
    verdict="error",
    impact="crash",
    conditions="FSDP1 with use_orig_params=False and units holding both frozen base weights and adapters",
    knobs=("fsdp_use_orig_params", "engine"),
    when=lambda s: (s.engine == "fsdp1" and s.frozen_params and not s.fsdp_use_orig_params
                    and not s.fsdp_frozen_units_separate),
    cause=("FSDP1 flattens all parameters of a unit into one FlatParameter, which has a single requires_grad. "
           "A decoder layer with frozen base weights and trainable adapters cannot be flattened."),
    fix="loraflow shards with FSDP2 (per-parameter sharding); choose engine fsdp2.",
    elsewhere="fsdp_use_orig_params=True, or wrap the adapter modules as their own units; prefer FSDP2",
    references=("torch/distributed/fsdp/_flat_param.py: FlatParamHandle._validate_tensors_to_flatten",
                "https://github.com/huggingface/peft/issues/1702"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Must flatten tensors with uniform `?requires_grad`?", "own",
                          "torch/distributed/fsdp/_flat_param.py: FlatParamHandle._validate_tensors_to_flatten"),
                  Message(r"`?FlatParameter`? requires uniform `?requires_grad", "own",
                          "torch/distributed/fsdp/flat_param.py: _init_flat_param (torch 1.13-2.0, even with "
                          "use_orig_params=True)", "torch>=1.13,<2.1"),
                  Message(r"expects all parameters to have same requires_grad", "own",
                          "torch/distributed/fsdp/flatten_params_wrapper.py (an assert)", "torch<1.13")),
        frames=FLAT_PARAM_FRAMES,
        evidence=(Evidence("peft", 1, "adapters train on a frozen base"),
                  Evidence("fsdp1", 1, "FSDP1 is in use")),
        prior=2.5,
        tells_apart="adapters (trainable) and base weights (frozen) in one FSDP1 unit with use_orig_params=False"),
))

register(Rule(
    id="fsdp-frozen-grad-memory",
    title="FSDP1 units mixing frozen and trainable weights allocate full gradient buffers",
    verdict="fix",
    impact="slow",
    conditions="FSDP1 units holding both frozen base weights and adapters (use_orig_params=True)",
    knobs=("fsdp_frozen_units_separate", "engine"),
    when=lambda s: (s.engine == "fsdp1" and s.frozen_params and s.fsdp_use_orig_params
                    and not s.fsdp_frozen_units_separate),
    cause=("With use_orig_params=True FSDP1 still keeps one flat gradient buffer per unit, sized for all of its "
           "parameters. A unit of frozen weights plus small adapters allocates gradient memory as large as full "
           "fine-tuning: no error, the memory saving of the adapter is gone."),
    fix="loraflow puts frozen weights in sharded units of their own (its FSDP2 engine shards each frozen base "
        "Linear separately), so gradient buffers hold only trainable parameters.",
    remedy=lambda s: {"fsdp_frozen_units_separate": True},
    elsewhere="wrap so frozen weights form their own units (a lambda policy on the LoRA modules); prefer FSDP2",
    references=("https://github.com/pytorch/pytorch/issues/91167", "https://github.com/pytorch/pytorch/issues/91165"),
    fixed_in="design (FSDP2 shards per parameter)",
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
        evidence=(Evidence("generation", 2, "generation runs"),
                  Evidence("allgather_timeout", 2, "an all-gather timed out"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"))),
))

register(Rule(
    id="fsdp2-multi-forward-dtensor",
    title="Several forwards before one backward under FSDP2 with checkpointing",
    verdict="fix",
    impact="crash",
    conditions="FSDP2, activation checkpointing, more than one forward through the trained model before backward "
               "(DPO chosen and rejected separately)",
    knobs=("forwards_per_step",),
    affected={"torch": "<2.11"},
    when=lambda s: s.engine == "fsdp2" and _checkpointed(s) and s.forwards_per_step > 1,
    cause=("FSDP2 reshards a unit after its forward and re-registers plain tensors for the recompute; a second "
           "forward before backward leaves the recompute of the first one mixing sharded DTensor parameters with "
           "unsharded tensors."),
    fix="loraflow concatenates chosen and rejected into one forward (one forward per step).",
    remedy=lambda s: {"forwards_per_step": 1},
    elsewhere="concatenate chosen/rejected into one batch (TRL/OpenRLHF default), or disable checkpointing",
    references=("https://github.com/pytorch/pytorch/pull/171779", "https://github.com/pytorch/pytorch/issues/153354",
                "https://github.com/pytorch/pytorch/issues/187437"),
    fixed_in="torch 2.11.0 (PR #171779); pytorch#187437 reports a variant (checkpoint around the sharded parent)",
    log=LogSigns(
        messages=(Message(r"got mixed torch\.Tensor and DTensor", "own",
                          "torch/distributed/tensor/_dispatch.py: OpDispatcher"),),
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("fsdp2", 2, "FSDP2 is in use"),
                  Evidence("dtensor", 2, "DTensor parameters are involved"),
                  Evidence("multi_forward", 2, "a preference stage runs several forwards before one backward"))),
))

register(Rule(
    id="dora-sharded-weight",
    title="DoRA reads a sharded base weight for its norm",
    verdict="fix",
    impact="crash",
    conditions="DoRA under ZeRO-3, or under FSDP1 (flat parameters) with peft < 0.12, base weight not gathered for "
               "the norm",
    knobs=("dora_weight_gather", "engine"),
    when=lambda s: (s.adapter == "dora" and not s.dora_weight_gather
                    and (s.zero3 or (s.engine == "fsdp1" and _older(s, "peft", "0.12")))),
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
    cause=("bitsandbytes stores 4-bit weights packed in uint8 by default. FSDP flattens and ZeRO-3 partitions "
           "parameters by dtype, so uint8 storage beside bf16 weights fails to flatten or is silently upcast."),
    fix="loraflow sets bnb_4bit_quant_storage to the model's dtype.",
    remedy=lambda s: {"quant_storage_matches": True},
    elsewhere="BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16) (the model's dtype)",
    references=("https://huggingface.co/docs/peft/accelerate/fsdp",
                "https://github.com/huggingface/transformers/pull/29587"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Cannot flatten integer dtype tensors", "own",
                          "torch/distributed/fsdp/_flat_param.py: _validate_tensors_to_flatten", "torch>=2.1"),
                  Message(r"Integer parameters are unsupported", "own", "torch/distributed/fsdp/flat_param.py",
                          "torch>=1.13,<2.1"),
                  Message(r"non-floating frozen Params4bit", "warning", "accelerate fsdp_utils.py fsdp2_prepare_model "
                          "(excludes them from sharding)", "accelerate>=1.14"),
                  FLATTEN_DTYPE),
        frames=FLAT_PARAM_FRAMES,
        evidence=(Evidence("flatten:int", 8, "the flattened tensors include integer (packed 4-bit) storage",
                           decisive=True, alone=True),
                  Evidence("flatten:other", 4, "two half-precision types: 4-bit storage in a dtype unlike the "
                           "model's"),
                  Evidence("flatten:half-and-float", -6, "a half tensor beside a float32 one: mixed parameter "
                           "dtypes, not 4-bit storage"),
                  Evidence("quant4bit", 3, "a 4-bit base is in use")),
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
                  SIZE_ZERO_OPERAND),
        frames=(Message(r":(merge_and_unload|_unload_and_optionally_merge|merge_adapter|_fuse_lora|fuse_lora_weight|"
                        r"fuse_lora|merge_lora)$", "own"),
                Message(r"lora(/layer)?\.py:(merge|get_delta_weight)$", "own")),
        evidence=(Evidence("merge_frames", 5, "the traceback runs through a LoRA merge", decisive=True),
                  Evidence("merge", 2, "adapter weights are merged"),
                  Evidence("shape_zero", 2, "a tensor of size 0 (a ZeRO-3 placeholder)"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("deepspeed", 1, "DeepSpeed is in use")),
        prior=2.0,
        tells_apart="merge_and_unload (or a hybrid engine's LoRA fuse) runs while DeepSpeed ZeRO-3 holds the model"),
))

register(Rule(
    id="fsdp1-mixed-dtype",
    title="FSDP1 cannot flatten float32 adapters beside a half-precision base",
    verdict="error",
    impact="crash",
    conditions="FSDP1 units holding both a bf16/fp16 base and float32 adapters (PEFT upcasts adapters of a "
               "half-precision base since peft 0.12), adapters not wrapped as their own units",
    knobs=("mixed_param_dtypes", "fsdp_frozen_units_separate", "engine"),
    when=lambda s: (s.engine == "fsdp1" and s.adapter != "full" and s.mixed_param_dtypes
                    and not s.fsdp_frozen_units_separate),
    cause=("FSDP1 flattens every parameter of a unit into one FlatParameter of a single dtype. A decoder layer whose "
           "base weights were loaded in bf16 and whose LoRA weights are float32 cannot be flattened: `Must flatten "
           "tensors with uniform dtype but got torch.bfloat16 and torch.float32`."),
    fix="loraflow shards with FSDP2 (per-parameter sharding, where each tensor keeps its own dtype); choose engine "
        "fsdp2.",
    elsewhere="load the base in float32 and let FSDP's MixedPrecision cast it, or keep adapters in the base dtype "
              "(get_peft_model(..., autocast_adapter_dtype=False)), or wrap the LoRA modules as their own units "
              "(peft's fsdp_auto_wrap_policy); prefer FSDP2",
    references=("https://github.com/huggingface/peft/issues/484",
                "https://github.com/axolotl-ai-cloud/axolotl/pull/1462",
                "torch/distributed/fsdp/_flat_param.py: FlatParamHandle._validate_tensors_to_flatten"),
    fixed_in="design (FSDP2 shards per parameter)",
    log=LogSigns(
        messages=(FLATTEN_DTYPE,),
        frames=FLAT_PARAM_FRAMES,
        evidence=(Evidence("flatten:half-and-float", 8, "a half-precision tensor beside a float32 one in one unit",
                           decisive=True, alone=True),
                  Evidence("flatten:int", -8, "integer storage points at 4-bit quantization instead"),
                  Evidence("peft", 2, "adapters train on a frozen base"),
                  Evidence("half", 1, "half precision is in use"),
                  Evidence("fsdp1", 1, "FSDP1 is in use"),
                  Evidence("flatten:other", -4, "two half-precision types: a storage dtype unlike the model's"),
                  Evidence("quant4bit", -2, "a 4-bit base points at its storage dtype instead")),
        prior=2.0,
        tells_apart="a bf16/fp16 base with float32 LoRA weights under FSDP1; the dtypes in the message are a half type "
                    "and float32"),
))

register(Rule(
    id="sequence-parallel-recompute",
    title="Checkpoint recompute sees another sequence split than the forward (context/sequence parallelism)",
    verdict="error",
    impact="crash",
    conditions="activation checkpointing (non-reentrant) of a model with frozen weights (LoRA) with the sequence "
               "split across ranks by context or sequence parallelism (FSDP2 context_parallel, Ulysses), where the "
               "recompute runs outside the split the forward ran in (reported with LoRA; full fine-tuning with "
               "context parallelism runs in TRL's own examples)",
    knobs=("sequence_parallel", "checkpointing"),
    when=lambda s: s.sequence_parallel and s.frozen_params and _checkpointed(s) and s.reentrant is False,
    cause=("Context and sequence parallelism shard or gather the sequence around each attention call (torch's "
           "context_parallel rewrites buffers in place on entry; Ulysses all-to-alls heads and sequence). When the "
           "checkpointed layers recompute in backward outside that context, attention sees the local slice instead "
           "of the sequence the forward saw, and the recomputed tensors come back with the sequence dimension divided "
           "by the parallel degree."),
    fix="loraflow has no context or sequence parallelism; it refuses the combination rather than train with it.",
    elsewhere="run backward inside the same context-parallel context as the forward, or turn off gradient "
              "checkpointing for this run, or drop context parallelism",
    references=("https://github.com/huggingface/trl/issues/4314", "https://github.com/verl-project/verl/issues/4664",
                "https://github.com/ByteDance-Seed/VeOmni/issues/979"),
    fixed_in="open upstream (trl#4314)",
    log=LogSigns(
        messages=RECOMPUTE_MESSAGES,
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("meta:sequence-split", 8, "a recomputed tensor is shorter along one dimension by a whole "
                           "factor: the sequence split between ranks differs between forward and recompute",
                           decisive=True, alone=True),
                  *recompute_rivals("meta:sequence-split"),
                  Evidence("seq_parallel", 4, "context or sequence parallelism is in use")),
        prior=1.0,
        tells_apart="context/sequence parallelism (cp_size, ulysses_sequence_parallel_size, ring attention) together "
                    "with gradient checkpointing; a recomputed sequence length the saved one divided by the degree"),
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
        messages=(Message(r"expected there to be only one unique element in <generator object .{0,80}"
                          r"all_gather_coalesced", "own",
                          "deepspeed/runtime/zero/partition_parameters.py: all_gather_coalesced (get_only_unique_item)",
                          "deepspeed<0.12.3"),
                  Message(r"output tensor must have the same type as input tensor", "shared",
                          "torch.distributed all_gather_into_tensor from ZeRO-3's _allgather_params_coalesced")),
        frames=(Message(r"partition_parameters\.py:(all_gather_coalesced|_allgather_params_coalesced)$", "shared"),),
        evidence=(Evidence("zero3_hooks", 3, "ZeRO-3 parameter code is in the traceback"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("peft", 2, "adapters (float32 by default) train on a half-precision base"),
                  Evidence("half", 1, "half precision is in use")),
        prior=1.0,
        tells_apart="ZeRO-3 with LoRA on a bf16/fp16 base; the traceback runs through partition_parameters.py's "
                    "coalesced all-gather"),
))
