"""The rules of sharded and distributed engines: DeepSpeed ZeRO, FSDP1/FSDP2, DDP; ids from the failure catalog.

Version conditions live in `affected` (the registry compares them with the installed or given versions), so the
same rule answers for loraflow's own plan, for `check --versions`, and for `explain` when a log shows a version.
"""

from __future__ import annotations

from packaging.version import Version

from loraflow.rules.registry import Evidence, Rule, register
from loraflow.rules.setup import Setup

# torch's CheckpointError text: shared by three rules (and by unrelated recompute bugs), so it is weak for each and
# the engine or cache evidence in the same log decides.
_RECOMPUTE_METADATA = r"Recomputed values for the following tensors have different metadata"


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
    weak_signatures=(_RECOMPUTE_METADATA,),
    evidence=(Evidence(r"torch\.Size\(\[0\]\)|shape[=:]?\s*\[0\]|'shape': torch\.Size\(\[0\]\)", 4,
                       "a recomputed shape [0]: a released ZeRO-3 partition"),
              Evidence(r"deepspeed[/\\]runtime[/\\]zero|partition_parameters|stage3", 3,
                       "ZeRO-3 code is in the traceback"),
              Evidence(r"deepspeed", 1, "DeepSpeed is in use"),
              Evidence(r"dtype=torch\.(bfloat16|float16)", -1, "a dtype difference points elsewhere")),
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
    signatures=(r"Expected query, key, and value to have the same dtype",),
    weak_signatures=(_RECOMPUTE_METADATA,),
    evidence=(Evidence(r"dtype[=:]\s*torch\.(bfloat16|float16)|torch\.(bfloat16|float16)", 3,
                       "a half-precision dtype is in the mismatch"),
              Evidence(r"fsdp|fully_shard|_fsdp_param|FSDPModule", 3, "FSDP is in the traceback"),
              Evidence(r"torch\.Size\(\[0\]\)", -3, "a shape-[0] tensor points at ZeRO-3 instead")),
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
    signatures=(r"backward pass is invalid for module in evaluation mode",),
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
    signatures=(r"Expected to mark a variable ready only once", r"marked as ready twice"),
    evidence=(Evidence(r"find_unused_parameters", 2, "DDP's unused-parameter search is named"),
              Evidence(r"checkpoint", 1, "checkpointing is in use")),
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
    signatures=(r"Must flatten tensors with uniform `?requires_grad`? when `?use_orig_params=False",),
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
    signatures=(r"size mismatch for .*lora_[AB].*torch\.Size\(\[0\]\)",
                r"copying a param with shape torch\.Size\(\[0\]\)"),
    evidence=(Evidence(r"lora_[AB]|adapter_model", 2, "adapter tensors are named"),),
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
    weak_signatures=(r"Watchdog caught collective operation timeout", r"synced_gpus"),
    evidence=(Evidence(r"generate|generation", 2, "generation is in the traceback"),
              Evidence(r"_ALLGATHER|all_gather", 2, "an all-gather timed out")),
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
    signatures=(r"got mixed torch\.Tensor and DTensor",),
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
    weak_signatures=(r"IndexError: tuple index out of range", r"mat1 and mat2 shapes cannot be multiplied",
                     r"The size of tensor a \(0\) must match the size of tensor b"),
    evidence=(Evidence(r"peft[/\\]tuners[/\\]lora[/\\]dora\.py|DoraLinearLayer|get_weight_norm", 4,
                       "DoRA's code is in the traceback"),
              Evidence(r"deepspeed|fsdp", 1, "a sharding engine is in use")),
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
    signatures=(r"Cannot flatten integer dtype tensors", r"Must flatten tensors with uniform `?dtype"),
    evidence=(Evidence(r"bitsandbytes|Params4bit|uint8", 3, "4-bit storage is in the traceback"),),
))
