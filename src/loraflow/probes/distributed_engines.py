"""Engine plumbing for the 2-rank reproductions: a DeepSpeed engine from a config dict, FSDP2 sharding with the
checkpoint wrapper inside or outside each unit, full gradients from sharded engines, and the two gathers the
registry's remedies ask for (DoRA's base weight, generation). Every rank calls these in the same order: most of
them are collective."""

from __future__ import annotations

import contextlib

import torch

from loraflow.engines.base import clean_name
from loraflow.engines.deepspeed import (  # noqa: F401
    dora_gather_base_weight,
    import_deepspeed,
    lift_zero3_hooks,
    restore_zero3_hooks,
)
from loraflow.probes.tiny import tiny_llama, with_adapters
from loraflow.rules.combination import Combination

LR = 0.1
"""SGD learning rate of the DeepSpeed step (plain SGD keeps the single-process reference step exact)."""

# --- DeepSpeed -----------------------------------------------------------------------------------------------


def zero_config(setup: Combination) -> dict:
    """fp32, the ZeRO stage from the Combination, and every parameter partitioned however small and released right after
    use, as a real model's are (the default persistence threshold of 100k elements would keep all of this tiny
    model's weights whole on every rank, and the default live/reuse/prefetch budgets would keep them gathered)."""
    zero: dict = {"stage": setup.zero_stage}
    if setup.zero_stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0,
                    stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True, "wall_clock_breakdown": False}


def deepspeed_engine(model, setup: Combination):
    """`deepspeed.initialize` with a config dict (zero_config) and a torch SGD optimizer: no DeepSpeed op to
    compile, and the single-process reference step stays exact."""
    deepspeed = import_deepspeed("cpu")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=zero_config(setup))
    return engine


def zero3_partition(model, setup: Combination) -> None:
    """Partition an existing model's weights as `from_pretrained` under ZeRO-3 (deepspeed.zero.Init) leaves them
    before adapters are added: every rank keeps a slice, the module's tensors become empty placeholders.
    (Converting a built model keeps the reference's exact initial values; constructing inside `zero.Init` would
    not, and on torch 2.13 + deepspeed 0.19.8 entering it fails on torch._dynamo's lazy import unless that was
    imported first.)"""
    deepspeed = import_deepspeed("cpu")
    deepspeed.zero.Init(module=model, config_dict_or_path=zero_config(setup))


@contextlib.contextmanager
def zero3_visible_to_peft(config: dict, enabled: bool = True):
    """While adapters are created, let peft see that ZeRO-3 is on: its DoRA init then gathers each base layer
    (peft's gather_params_ctx) before computing the weight norm. peft looks for transformers' HfDeepSpeedConfig,
    which the HF Trainer and accelerate keep alive and a hand-written DeepSpeed loop does not."""
    if not enabled:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep = HfDeepSpeedConfig(config)  # noqa: F841  (registers itself through a weak reference)
    try:
        yield
    finally:
        unset_hf_deepspeed_config()


def ds_full_grads(engine) -> dict:
    """Every trainable parameter's full (all-rank averaged) gradient, gathered from ZeRO's partitions."""
    from deepspeed.utils import safe_get_full_grad

    return {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters() if p.requires_grad}


def sgd_reference_adapter(setup: Combination, batch) -> dict:
    """The adapter state after the same SGD step taken in one process without any engine."""
    from peft import get_peft_model_state_dict

    model = with_adapters(tiny_llama(use_cache=False), setup)
    model(**batch, use_cache=False).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p -= LR * p.grad
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


@contextlib.contextmanager
def _count_all_gathers(box: list):
    """Counts the all-gather collectives dispatched inside (torch's profiler records each c10d op)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    # one c10d::_allgather_base_ (or allgather_*) dispatcher op per collective; the backend's own gloo:all_gather
    # record would count each one twice
    box.append(sum(e.count for e in prof.key_averages() if e.key.startswith("c10d::") and "allgather" in e.key))


def generation_gathers(engine, tokens: int, gather_once: bool) -> tuple[int, int, float]:
    """(all-gather ops before the rollout, all-gather ops during generate(), seconds generate() took) for a greedy
    rollout of `tokens` tokens. Gathering once is GatheredParameters over every parameter plus lifting DeepSpeed's
    module hooks: GatheredParameters alone still lets each module's post-forward hook release its weights, and
    the next token gathers them again (measured: 343 of the 392 per-rollout all-gathers remain)."""
    import time

    import deepspeed

    model = engine.module
    model.eval()
    prompt = torch.randint(3, 96, (1, 4), generator=torch.Generator().manual_seed(7))
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    before, during = [], []
    with torch.no_grad():
        if not gather_once:
            before.append(0)
            with _count_all_gathers(during):
                start = time.perf_counter()
                model.generate(prompt, synced_gpus=True, **kwargs)  # sharded ranks must step together
                seconds = time.perf_counter() - start
        else:
            with _count_all_gathers(before):
                gathered = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
                gathered.__enter__()
                lift_zero3_hooks(engine)
            try:
                with _count_all_gathers(during):
                    start = time.perf_counter()
                    model.generate(prompt, **kwargs)
                    seconds = time.perf_counter() - start
            finally:
                restore_zero3_hooks(engine)
                gathered.__exit__(None, None, None)
    return before[0], during[0], seconds


# --- DDP / FSDP ----------------------------------------------------------------------------------------------


def full_grads(model) -> dict:
    """Trainable gradients by their single-process names; FSDP2's DTensor shards are all-gathered (collective)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        if isinstance(g, DTensor):
            g = g.full_tensor()
        out[clean_name(name)] = None if g is None else g.detach().clone()
    return out


def fsdp2_shard(model, setup: Combination):
    """fully_shard each decoder layer, then the root, on a CPU mesh of all ranks, the layers with a bf16
    MixedPrecisionPolicy for `bf16-mixed`. Checkpointing (torch's checkpoint_wrapper, non-reentrant unless the
    Combination says otherwise) goes inside each sharded unit (wrap, then shard) or, for checkpoint_outside_shard,
    around it (shard, then wrap)."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from loraflow.setup.checkpointing import hf_model

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if setup.precision == "bf16-mixed" else MixedPrecisionPolicy())
    impl = CheckpointImpl.REENTRANT if setup.reentrant else CheckpointImpl.NO_REENTRANT
    layers = hf_model(model).model.layers
    every = 1 if setup.checkpointing == "all" else setup.checkpoint_every_n
    for i, layer in enumerate(layers):
        checkpointed = setup.checkpointing != "off" and i % every == 0
        if checkpointed and not setup.checkpoint_outside_shard:
            layer = checkpoint_wrapper(layer, checkpoint_impl=impl)
        fully_shard(layer, mesh=mesh, mp_policy=policy)
        if checkpointed and setup.checkpoint_outside_shard:
            layer = checkpoint_wrapper(layer, checkpoint_impl=impl)
        layers[i] = layer
    # The root (embeddings, final norm, head) stays fp32: each layer then gets fp32 inputs (hidden states, rotary
    # cos/sin) that FSDP2 casts to bf16 in the layer's pre-forward hook, the cast a recompute outside the sharded
    # unit skipped on torch < 2.13.
    fully_shard(model, mesh=mesh)
    return model
