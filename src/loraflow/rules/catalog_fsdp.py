"""The rules of FSDP (FSDP1's flat parameters, FSDP2's per-parameter sharding) and of sequence sharding under
checkpointing; ids from the failure catalog where it has them."""

from __future__ import annotations

from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import (
                                  FLAT_PARAM_FRAMES,
                                  FLATTEN_DTYPE,
                                  RECOMPUTE_FRAMES,
                                  RECOMPUTE_MESSAGES,
                                  Evidence,
                                  LogSigns,
                                  Message,
                                  recompute_rivals,
)

# DTensor's dispatcher refuses a plain tensor beside sharded (DTensor) parameters: a recompute after a second forward,
# or generate() outside FSDP2's forward hooks. The frames say which.
MIXED_DTENSOR = Message(r"got mixed torch\.Tensor and DTensor|got mixed distributed and non-distributed tensors",
                        "shared", "torch/distributed/tensor/_dispatch.py: OpDispatcher (`mixed distributed and "
                        "non-distributed tensors` in torch 2.0)")
# torch's auto-wrap check of each unit it wraps (torch>=2.1), before any flattening: with use_orig_params=False a unit
# of frozen and trainable weights is refused outright.
FROZEN_MIXED_UNIT = Message(r"has both parameters with requires_grad=True and False\. FSDP does not support wrapping "
                            r"such modules", "own",
                            "torch/distributed/fsdp/_wrap_utils.py: _validate_frozen_params (use_orig_params=False: "
                            "raise ValueError)", "torch>=2.1")
# Both FSDP2 rules leave a sharded weight where a plain one was expected: the first op to fail reads a weight. An
# attention kernel named by the refusal points at DTensor activations instead (tensor parallelism, NeMo-RL#1051).
DTENSOR_ACTIVATIONS = Evidence("dtensor:attention-op", -6, "the refusing op is an attention kernel, which reads "
                               "activations only: DTensor activations of a tensor/context-parallel plan, not FSDP2's "
                               "parameters")


register(Rule(
    id="fsdp2-recompute-cast",
    title="FSDP2 mixed precision skipped its casts during checkpoint recompute",
    verdict="fix",
    impact="crash",
    conditions="FSDP2 with a MixedPrecisionPolicy (bf16/fp16), checkpoint wrapper placed outside the sharded "
               "unit, a unit input the policy casts (the root left in float32, or an image-text model's towers), "
               "torch < 2.13 (LoRA and DoRA alike)",
    knobs=("checkpoint_outside_shard", "precision"),
    affected={"torch": "<2.13"},
    # The skipped cast matters only for an input not already in param_dtype (pytorch#150140): a text model whose
    # root is sharded under the same policy feeds its layers bf16 hidden states, rotary tables and masks.
    when=lambda s: (s.dtensor_params and s.checkpointed and s.half_precision and s.checkpoint_outside_shard
                    and not (s.fsdp2_root_in_policy and not s.image_text)),
    cause=("FSDP2 casts a unit's inputs and outputs to the policy's dtype in its forward hooks. When the "
           "checkpoint wraps the sharded unit from outside, the recompute in backward ran without those casts, so "
           "recomputed tensors came back in a different dtype than the forward saved."),
    fix="loraflow applies checkpointing inside each sharded unit (wrap, then fully_shard) and keeps layer inputs in "
        "the parameter dtype.",
    remedy=lambda s: {"checkpoint_outside_shard": False},
    elsewhere="upgrade to torch>=2.13; else apply the checkpoint wrapper before fully_shard",
    references=("https://github.com/pytorch/pytorch/pull/182580", "https://github.com/pytorch/pytorch/issues/159359",
                "https://github.com/pytorch/pytorch/issues/150140"),
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
    id="fsdp1-mixed-requires-grad",
    title="FSDP1 cannot flatten frozen and trainable weights into one unit",
    verdict="error",
    impact="crash",
    conditions="FSDP1 with use_orig_params=False and units holding both frozen base weights and adapters",
    knobs=("fsdp_use_orig_params", "engine"),
    when=lambda s: (s.flat_params and s.frozen_params and not s.fsdp_use_orig_params
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
                          "torch/distributed/fsdp/flatten_params_wrapper.py (an assert)", "torch<1.13"),
                  FROZEN_MIXED_UNIT),
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
    when=lambda s: (s.flat_params and s.frozen_params and s.fsdp_use_orig_params
                    and not s.fsdp_frozen_units_separate),
    cause=("With use_orig_params=True FSDP1 still keeps one flat gradient buffer per unit, sized for all of its "
           "parameters. A unit of frozen weights plus small adapters allocates gradient memory as large as full "
           "fine-tuning: no error, the memory saving of the adapter is gone."),
    fix="loraflow puts frozen weights in sharded units of their own (its FSDP2 engine shards each frozen base "
        "Linear separately), so gradient buffers hold only trainable parameters.",
    remedy=lambda s: {"fsdp_frozen_units_separate": True},
    elsewhere="wrap so frozen weights form their own units (a lambda policy on the LoRA modules); prefer FSDP2",
    references=("https://github.com/pytorch/pytorch/issues/91167", "https://github.com/pytorch/pytorch/issues/91165",
                "https://github.com/pytorch/pytorch/pull/104427 (_validate_frozen_params)"),
    fixed_in="design (FSDP2 shards per parameter)",
    log=LogSigns(
        # torch checks each unit an auto-wrap policy picks: with use_orig_params=True it warns (this rule), with
        # False it raises (fsdp1-mixed-requires-grad, FROZEN_MIXED_UNIT).
        messages=(Message(r"has both parameters with requires_grad=True and False\. (We|FSDP) do(es)? not recommend "
                          r"wrapping such modules", "warning",
                          "torch/distributed/fsdp/_wrap_utils.py: _validate_frozen_params (use_orig_params=True: "
                          "warnings.warn; `FSDP does not recommend` in the check's first wording)", "torch>=2.1"),),
        evidence=(Evidence("peft", 1, "adapters train on a frozen base"),
                  Evidence("fsdp1", 1, "FSDP1 is in use")),
        prior=1.0,
        tells_apart="FSDP1 with use_orig_params=True and an auto-wrap policy that puts LoRA modules in the units of "
                    "their frozen layers: torch warns per unit, naming the numel it will allocate for gradients"),
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
    when=lambda s: s.dtensor_params and s.checkpointed and s.forwards_per_step > 1,
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
        messages=(MIXED_DTENSOR,),
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("fsdp2", 2, "FSDP2 is in use"),
                  Evidence("dtensor", 2, "DTensor parameters are involved"),
                  Evidence("multi_forward", 2, "a preference stage runs several forwards before one backward"),
                  Evidence("generate_frames", -4, "the error is raised inside generate, which points elsewhere"),
                  DTENSOR_ACTIVATIONS),
        prior=2.0,
        tells_apart="FSDP2 with activation checkpointing and chosen/rejected run as separate forwards (DPO) on "
                    "torch < 2.11; the traceback runs through checkpoint's recompute"),
))

register(Rule(
    id="fsdp1-mixed-dtype",
    title="FSDP1 cannot flatten float32 adapters beside a half-precision base",
    verdict="error",
    impact="crash",
    conditions="FSDP1 units holding both a bf16/fp16 base and float32 adapters (PEFT upcasts adapters of a "
               "half-precision base since peft 0.12), adapters not wrapped as their own units",
    knobs=("mixed_param_dtypes", "fsdp_frozen_units_separate", "engine"),
    when=lambda s: (s.flat_params and s.adapter != "full" and s.mixed_param_dtypes
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
                  Evidence("flatten:int-codes", -8, "integer weights point at a quantized base instead"),
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
    # Not FSDP1 (flat parameters): verl#4664 runs Ulysses with FSDP1 and checkpointing fine, only FSDP2 fails.
    when=lambda s: (s.sequence_parallel and s.frozen_params and s.checkpointed and s.reentrant is False
                    and not s.flat_params),
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
    id="fsdp2-generate-unsharded",
    title="generate() on an FSDP2 model runs outside FSDP's forward hooks",
    verdict="fix",
    impact="crash",
    conditions="FSDP2 and generate() on the trained model (GRPO/PPO rollouts) without unsharding the parameters "
               "first or registering generate as an FSDP forward method",
    knobs=("generation_gather",),
    when=lambda s: s.dtensor_params and s.generation and not s.generation_gather,
    cause=("FSDP2 all-gathers a module's parameters in the hooks of its forward() only. generate() is another method "
           "of the root module, so the decoding forwards meet parameters that are still DTensor shards beside the "
           "plain tensors of the inputs: `got mixed torch.Tensor and DTensor`."),
    fix="loraflow unshards the FSDP2 model once per rollout and keeps it unsharded while generate() runs.",
    remedy=lambda s: {"generation_gather": True},
    elsewhere="call torch.distributed.fsdp.register_fsdp_forward_method(model, 'generate') (torch >= 2.4), or unshard "
              "(model.unshard() / summon full params) around generate; or generate with vLLM",
    references=("https://github.com/pytorch/pytorch/issues/123962", "https://github.com/pytorch/pytorch/pull/125394",
                "https://github.com/huggingface/transformers/pull/42436"),
    fixed_in="torch 2.4 adds register_fsdp_forward_method; callers must use it (transformers PR #42436)",
    log=LogSigns(
        messages=(MIXED_DTENSOR,),
        frames=(Message(r"generation/utils\.py:(generate|_sample|_greedy_search)$|:generate$", "generic"),),
        evidence=(Evidence("generate_frames", 3, "the error is raised inside generate()"),
                  Evidence("generation", 1, "the model generates (rollouts)"),
                  Evidence("fsdp2", 3, "FSDP2 is in use"),
                  Evidence("zero3", -3, "ZeRO-3 is in use, which points at its own generation rules"),
                  Evidence("recompute_frames", -4, "the error is raised during checkpoint recompute instead"),
                  DTENSOR_ACTIVATIONS),
        prior=1.0,
        tells_apart="FSDP2 with GRPO/PPO rollouts from model.generate (not vLLM); the traceback runs through "
                    "generation/utils.py"),
))

register(Rule(
    id="fsdp2-reentrant-cross-attention",
    title="FSDP2 with reentrant checkpointing breaks image cross-attention layers",
    verdict="fix",
    impact="crash",
    conditions="FSDP2, reentrant checkpointing, a model whose images enter the language model through "
               "cross-attention layers (Mllama)",
    knobs=("engine", "reentrant", "image_cross_attention"),
    when=lambda s: s.dtensor_params and s.image_cross_attention and s.checkpointed and s.reentrant is True,
    cause=("Mllama computes its image states once, outside the decoder layers, and hands them to each "
           "cross-attention layer as a keyword argument. Reentrant checkpointing detaches only positional inputs, "
           "so the recompute in backward reaches the image states' graph through the layer, beside FSDP2's own "
           "backward hooks on the vision units, and the first backward fails: `Trying to backward through the "
           "graph a second time` (the composition sweep: any adapter and tower setting; one process, DDP and "
           "non-reentrant checkpointing train; torch 2.13, transformers 5.23)."),
    fix="loraflow checkpoints these models non-reentrantly under FSDP2 (checkpointing.reentrant=false).",
    remedy=lambda s: {"reentrant": False},
    elsewhere="use non-reentrant checkpointing (gradient_checkpointing_kwargs={'use_reentrant': False}) with FSDP2 "
              "on Mllama",
    references=("torch/utils/checkpoint.py (CheckpointFunction: only positional tensor inputs are detached)",
                "transformers/models/mllama/modeling_mllama.py (cross_attention_states passed to each layer)"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"Trying to backward through the graph a second time", "generic",
                          "torch/autograd/graph.py: saved tensors freed"),),
        evidence=(Evidence("fsdp", 2, "FSDP is in use"),),
        tells_apart="an Mllama model (cross-attention image layers) under FSDP2 with reentrant checkpointing"),
))

BNB_FSDP_OPTIMIZER_STATE = "0.49.2"
"""bitsandbytes' Optimizer8bit.state_dict moves its quantization tensors under one non-tensor key that FSDP leaves
alone (bitsandbytes PR #1840; optim/optimizer.py of the 0.49.1 and 0.49.2 wheels)."""


register(Rule(
    id="fsdp1-8bit-optimizer-save",
    title="An FSDP1 checkpoint of a bitsandbytes 8-bit optimizer's state",
    verdict="fix",
    impact="crash",
    conditions="FSDP1 (FullyShardedDataParallel) with a bitsandbytes 8-bit or paged 8-bit optimizer (adamw_bnb_8bit, "
               "adamw_8bit, paged_adamw_8bit, lion_8bit, ...) whose state a checkpoint saves (the HF Trainer's "
               "save_steps checkpoints, accelerate's save_state), with bitsandbytes < 0.49.2",
    knobs=("optimizer_8bit", "saves_optimizer_state"),
    affected={"bitsandbytes": f"<{BNB_FSDP_OPTIMIZER_STATE}"},
    when=lambda s: s.flat_params and s.optimizer_8bit and s.saves_optimizer_state,
    cause=("FSDP1 gathers or re-shards each parameter's optimizer state assuming every tensor in it has the shape of "
           "the parameter's flat shard and all of them one dtype. A bitsandbytes 8-bit optimizer keeps uint8 codes "
           "beside float32 block statistics (absmax) and a 256-entry quantization map, so the first checkpoint "
           "fails after the training time is spent: with use_orig_params the dtypes disagree (`Expected dtype == "
           "info.dtype, got torch.uint8 != torch.float32`); without it the all-gather meets buffers of another "
           "size and type. bitsandbytes 0.49.2 hands FSDP those tensors as non-tensor state."),
    fix="loraflow optimizes the adapters with torch's AdamW: no 8-bit state for FSDP to reshape.",
    remedy=lambda s: {"optimizer_8bit": False},
    elsewhere="pip install -U 'bitsandbytes>=0.49.2'; else a 32-bit optimizer under FSDP (adamw_torch, "
              "paged_adamw_32bit), save_only_model=True (no resume from the checkpoints), or DeepSpeed ZeRO",
    references=("https://github.com/bitsandbytes-foundation/bitsandbytes/issues/89",
                "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/323",
                "https://github.com/huggingface/accelerate/issues/1362",
                "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1403",
                "https://github.com/oumi-ai/oumi/pull/835",
                "https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1840"),
    fixed_in=f"bitsandbytes {BNB_FSDP_OPTIMIZER_STATE}",
    log=LogSigns(
        messages=(Message(r"Expected dtype == info\.dtype, got torch\.(uint8 != torch\.float32|"
                          r"float32 != torch\.uint8)", "own",
                          "torch/distributed/fsdp/_optim_utils.py: _convert_all_state_info"),
                  Message(r"output tensor must have the same type as input tensor", "generic",
                          "torch all_gather_into_tensor in FSDP's _communicate_optim_state (NCCL)"),
                  Message(r"ProcessGroupGloo::allgather: invalid tensor size", "generic",
                          "the same gather on gloo (scripts/fsdp1_8bit_optimizer_save.py)")),
        frames=(Message(r"torch[/\\.]distributed[/\\.]fsdp[/\\.]_optim_utils\.py:(_communicate_optim_state|"
                        r"_convert_all_state_info|_unflatten_optim_state|_gather_all_orig_param_state)$", "shared"),
                Message(r"accelerate[/\\.]utils[/\\.]fsdp_utils\.py:save_fsdp_optimizer$", "generic")),
        evidence=(Evidence("bnb_8bit_optim", 3, "a bitsandbytes 8-bit optimizer is in use", decisive=True),
                  Evidence("fsdp_optim_state", 2, "FSDP gathers the optimizer's state for a checkpoint",
                           decisive=True)),
        prior=0.5,
        tells_apart="the checkpoint save fails in FSDP's optimizer-state gather while a bitsandbytes 8-bit optimizer "
                    "is in use"),
))
