"""Reproductions on 2 ranks (gloo, CPU): DeepSpeed ZeRO, DDP, FSDP2 and FSDP1.

Each `execute` runs one step (or a save, or a generate) of the tiny Llama exactly as the Combination says, on both ranks
with the same batch, so the engine's averaged gradients must equal the single-process fp32 reference; a silent
failure shows as `wrong`, a crash as the library's own error (the worker logs its traceback).
Engine plumbing (DeepSpeed config, sharding, gathering gradients) lives in `distributed_engines.py`.
"""

from __future__ import annotations

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.cases import checkpoint_as_setup, reference_grads
from loraflow.probes.distributed_engines import (
    deepspeed_engine,
    dora_gather_base_weight,
    ds_full_grads,
    fsdp2_shard,
    full_grads,
    generation_gathers,
    sgd_reference_adapter,
    zero3_partition,
    zero3_visible_to_peft,
    zero_config,
)
from loraflow.probes.tiny import compare, tiny_llama, token_batch, with_adapters
from loraflow.rules.combination import Combination

LORA = Combination(adapter="lora", matched_modules=14, world_size=2)
ZERO3 = LORA.replace(engine="deepspeed", zero_stage=3)
DS = ("deepspeed",)


def _model(setup: Combination):
    model = with_adapters(tiny_llama(use_cache=setup.use_cache), setup)
    if not setup.engine_spec.units:  # an engine with sharded units places its torch wrapper around or inside them
        checkpoint_as_setup(model, setup)
    return model


def zero_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step under DeepSpeed ZeRO (stage from the Combination, fp32, a torch optimizer), the same batch on both
    ranks; the gathered adapter gradients compared with the single-process fp32 reference"""
    model = _model(setup)
    engine = deepspeed_engine(model, setup)
    engine.module.train(setup.train_mode_at_backward)
    batch = token_batch()
    loss = engine(**batch, use_cache=setup.use_cache).loss
    engine.backward(loss)
    grads = ds_full_grads(engine)
    engine.step()
    return compare(grads, reference_grads(setup, batch))


case("zero3-frozen-recompute", ZERO3.replace(checkpointing="all", reentrant=False), ranks=2, requires=DS)(zero_step)


@case("zero3-eval-backward", ZERO3.replace(train_mode_at_backward=False), ranks=2, requires=DS)
def zero_eval_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step under ZeRO-3 with the model in the Combination's mode (eval, as after generate) during loss and
    backward; adapter gradients compared with the reference"""
    return zero_step(setup, ctx)


@case("zero3-stale-trace", ZERO3.replace(world_size=1, outside_forwards=True, generation=True, generation_gather=True),
      ranks=1, requires=DS)
def zero_generation_between_steps(setup: Combination, ctx: Context) -> Observation:
    """ZeRO-3 on one rank (every weight partitioned), each step preceded by what a run does outside its steps: a
    greedy generation with the weights gathered once and ZeRO-3's hooks lifted (evaluation, rollouts), a held-out
    forward, and one with the adapters disabled (DPO's reference), both in eval mode without autograd; two steps,
    the first one's adapter gradients compared with the reference"""
    import deepspeed

    from loraflow.engines.deepspeed import lift_zero3_hooks, restore_zero3_hooks
    from loraflow.engines.launch import init_distributed

    init_distributed("gloo")  # a one-rank group of its own (DeepSpeed would look for MPI without a launcher)
    model = _model(setup)
    engine = deepspeed_engine(model, setup)
    batch = token_batch()

    def generate() -> None:
        engine.module.eval()
        with torch.no_grad(), deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            lift_zero3_hooks(engine)
            try:
                engine.module.generate(input_ids=batch["input_ids"][:, :4], max_new_tokens=3, do_sample=False,
                                       pad_token_id=0)
            finally:
                restore_zero3_hooks(engine)
        with torch.no_grad():
            engine(**batch, use_cache=False)
            with engine.module.disable_adapter():
                engine(**batch, use_cache=False)
        engine.module.train()

    grads = None
    for _ in range(2):
        generate()
        engine.backward(engine(**batch, use_cache=False).loss)
        grads = grads or ds_full_grads(engine)
        engine.step()
    return compare(grads, reference_grads(setup, batch))


@case("dora-sharded-weight", ZERO3.replace(adapter="dora"), ranks=2, requires=DS)
def zero_dora_step(setup: Combination, ctx: Context) -> Observation:
    """DoRA added to a ZeRO-3-partitioned Llama (as from_pretrained under ZeRO-3 leaves it) in a hand-written
    DeepSpeed loop, a log-prob forward of the unwrapped module (an RLHF rollout), then one step through the engine;
    logits and gradients compared with the single-process reference"""
    model = tiny_llama(use_cache=False)
    zero3_partition(model, setup)
    # peft's DoRA init computes ||W|| of every base weight: gather them (per layer, peft's own gather) or not.
    with zero3_visible_to_peft(zero_config(setup), enabled=setup.dora_weight_gather):
        model = with_adapters(model, setup)
    if setup.dora_weight_gather:
        dora_gather_base_weight(model)  # and in every forward, also outside the engine's
    engine = deepspeed_engine(model, setup)
    batch = token_batch()
    with torch.no_grad():  # the rollout's log-probs come first in RLHF, before any step through the engine
        logits = engine.module(**batch, use_cache=False).logits
    engine.backward(engine(**batch, use_cache=False).loss)
    grads = ds_full_grads(engine)
    reference = with_adapters(tiny_llama(use_cache=False), setup)
    with torch.no_grad():
        expected = reference(**batch, use_cache=False).logits
    diff = float((logits - expected).abs().max())
    if diff > 1e-4:
        return Observation("wrong", f"no error raised, but the unwrapped module's logits differ by {diff:.3g}")
    return compare(grads, reference_grads(setup, batch))


@case("zero3-empty-adapter-save", ZERO3, ranks=2, requires=DS)
def zero_adapter_save(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step under ZeRO-3 (SGD), save_pretrained of the adapter (gathering the trainable partitions or
    not), reload with PeftModel.from_pretrained and compare with the same step taken in one process"""
    import deepspeed
    import torch.distributed as dist
    from peft import PeftModel, get_peft_model_state_dict

    model = _model(setup)
    engine = deepspeed_engine(model, setup)
    batch = token_batch()
    engine.backward(engine(**batch).loss)
    engine.step()
    path = _shared_dir(ctx)
    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    # GatheredParameters is collective: every rank enters it, rank 0 writes.
    with deepspeed.zero.GatheredParameters(trainable, modifier_rank=None, enabled=setup.adapter_save_gather):
        if ctx.rank == 0:
            engine.module.save_pretrained(path)
    dist.barrier()
    if ctx.rank != 0:
        return Observation("ok", "rank 0 saves and checks")
    reloaded = PeftModel.from_pretrained(tiny_llama(), path)  # raises on shape-[0] tensors
    saved = get_peft_model_state_dict(reloaded)
    expected = sgd_reference_adapter(setup, batch)
    empty = [n for n, t in saved.items() if t.numel() == 0 or not t.any()]
    if empty:
        return Observation("wrong", f"no error raised, but {len(empty)} of {len(saved)} saved adapter tensors are "
                                    f"empty or zero (e.g. {empty[0]})")
    worst = max(float((saved[n] - t).norm() / t.norm()) for n, t in expected.items())
    if worst > 1e-5:
        return Observation("wrong", f"no error raised, but the saved adapter differs from the trained one by "
                                    f"relative error {worst:.3g}")
    return Observation("ok", f"the reloaded adapter equals the single-process step ({len(saved)} tensors, max "
                             f"relative error {worst:.1e})")


def _shared_dir(ctx: Context) -> str:
    """One directory for both ranks: rank 0's workdir, broadcast."""
    import torch.distributed as dist

    box = [ctx.workdir]
    dist.broadcast_object_list(box, src=0)
    return box[0] + "/adapter"


@case("zero3-generation-gather", ZERO3.replace(stage="grpo", generation=True), ranks=2, requires=DS)
def zero_generate(setup: Combination, ctx: Context) -> Observation:
    """greedy generate() of 8 tokens from the ZeRO-3 engine's module, counting the all-gather collectives while it
    decodes (per token, or once per rollout with GatheredParameters and DeepSpeed's hooks lifted)"""
    model = _model(setup)
    engine = deepspeed_engine(model, setup)
    tokens = 8
    before, during, seconds = generation_gathers(engine, tokens, gather_once=setup.generation_gather)
    if during > 0:
        return Observation("wrong", f"no error raised, but generating {tokens} tokens ran {during} all-gather ops "
                                    f"({during / tokens:.0f} per token, every weight again at each step; "
                                    f"{seconds:.2f}s)")
    return Observation("ok", f"{before} all-gather ops once before the rollout, none while generating {tokens} "
                             f"tokens ({seconds:.2f}s)")


@case("ddp-reentrant-unused", LORA.replace(engine="ddp", checkpointing="all", reentrant=True, input_grad_hook=True,
                                           find_unused_parameters=True), ranks=2)
def ddp_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step under DDP (gloo) with transformers' checkpointing as the Combination says and the Combination's
    find_unused_parameters / static_graph; adapter gradients compared with the reference"""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(setup), find_unused_parameters=setup.find_unused_parameters,
                static_graph=setup.ddp_static_graph)
    batch = token_batch()
    model(**batch, use_cache=setup.use_cache).loss.backward()
    return compare(full_grads(model.module), reference_grads(setup, batch))


@case("adalora-reentrant-ddp", LORA.replace(engine="ddp", adalora_orth_reg=True, checkpointing="all", reentrant=True,
                                            input_grad_hook=True), ranks=2)
def adalora_ddp_step(setup: Combination, ctx: Context) -> Observation:
    """one AdaLoRA step (task type CAUSAL_LM, so its orthogonal regularization is in the loss) under DDP (gloo) with
    transformers' checkpointing as the Combination says and its static_graph; every lora_B must get a gradient"""
    from peft import AdaLoraConfig, get_peft_model
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    config = AdaLoraConfig(target_modules=["q_proj", "v_proj"], init_r=4, target_r=2, total_step=20,
                           task_type="CAUSAL_LM" if setup.adalora_orth_reg else None)
    model = get_peft_model(tiny_llama(use_cache=False), config)
    checkpoint_as_setup(model, setup)
    ddp = DDP(model, find_unused_parameters=setup.find_unused_parameters, static_graph=setup.ddp_static_graph)
    batch = token_batch()
    ddp(**batch, use_cache=False).loss.backward()
    missing = [n for n, p in model.named_parameters() if "lora_B" in n and p.grad is None]
    return Observation("wrong" if missing else "ok", f"{len(missing)} lora_B without a gradient" if missing else
                       "every lora_B has a gradient")


FSDP2 = LORA.replace(engine="fsdp2", checkpointing="all", reentrant=False, checkpoint_impl="torch-wrapper",
                     use_cache=False)


@case("fsdp2-recompute-cast", FSDP2.replace(precision="bf16-mixed", checkpoint_outside_shard=True), ranks=2)
def fsdp2_mixed_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step under FSDP2 (fully_shard per layer, MixedPrecisionPolicy bf16 params / fp32 reduce) with
    torch's checkpoint wrapper around or inside each sharded layer; gradients against the fp32 reference within
    bf16 tolerance"""
    model = fsdp2_shard(_model(setup), setup)
    batch = token_batch()
    model(**batch, use_cache=False).loss.backward()
    return compare(full_grads(model), reference_grads(setup, batch), tolerance=5e-2)


@case("fsdp2-multi-forward-dtensor", FSDP2.replace(stage="dpo", forwards_per_step=2), ranks=2)
def fsdp2_two_forwards(setup: Combination, ctx: Context) -> Observation:
    """FSDP2 with checkpointing inside each sharded layer: chosen and rejected rows as two forwards before one
    backward (or concatenated in one); gradients compared with the reference on both rows"""
    model = fsdp2_shard(_model(setup), setup)
    batch = token_batch(rows=2)
    if setup.forwards_per_step > 1:
        rows = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(2)]
        losses = [model(**row, use_cache=False).loss for row in rows]  # both forwards first, as DPO does
        loss = sum(losses) / len(losses)  # equal lengths: the same as the mean over the concatenated batch
    else:
        loss = model(**batch, use_cache=False).loss
    loss.backward()
    return compare(full_grads(model), reference_grads(setup, batch))


def _fsdp1(setup: Combination, dtype=torch.float32):
    """FSDP1 (FullyShardedDataParallel on CPU) around a LoRA model: one unit per decoder layer, and with
    fsdp_frozen_units_separate also one per adapter leaf (a lambda policy, the catalog's remedy). A bf16
    `dtype` loads the base in bf16 while PEFT keeps the adapters in float32."""
    import functools

    from peft.tuners.lora import LoraLayer
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import (
        _or_policy,
        lambda_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = with_adapters(tiny_llama(use_cache=setup.use_cache, dtype=dtype), setup)
    checkpoint_as_setup(model, setup)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    if setup.fsdp_frozen_units_separate:
        # PEFT's fsdp_auto_wrap_policy: every adapter leaf (all of its weights trainable) is a unit of its own, so
        # the layer's unit keeps only frozen weights of one dtype.
        adapters = {id(leaf) for m in model.modules() if isinstance(m, LoraLayer)
                    for leaf in (*m.lora_A.values(), *m.lora_B.values())}
        own = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in adapters)
        policy = functools.partial(_or_policy, policies=[own, policy])
    return FSDP(model, auto_wrap_policy=policy, use_orig_params=setup.fsdp_use_orig_params,
                device_id=torch.device("cpu"))


@case("fsdp1-mixed-requires-grad", LORA.replace(engine="fsdp1", fsdp_use_orig_params=False), ranks=2)
def fsdp1_wrap(setup: Combination, ctx: Context) -> Observation:
    """FSDP1 (FullyShardedDataParallel on CPU, one unit per decoder layer) around a LoRA model with the Combination's
    use_orig_params, then one step; gradients compared with the reference"""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = _fsdp1(setup)
    batch = token_batch()
    model(**batch, use_cache=setup.use_cache).loss.backward()
    with FSDP.summon_full_params(model, with_grads=True):
        grads = full_grads(model)
    return compare(grads, reference_grads(setup, batch))


@case("fsdp-frozen-grad-memory", LORA.replace(engine="fsdp1"), ranks=2)
def fsdp1_grad_memory(setup: Combination, ctx: Context) -> Observation:
    """FSDP1 with use_orig_params=True, one LoRA step; the gradient bytes this rank holds (every unit's flat
    gradient shard) compared with the trainable parameters' share, which is all an adapter needs"""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = _fsdp1(setup)
    model(**token_batch(), use_cache=setup.use_cache).loss.backward()
    units = [m for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]
    held = sum(u._handle.flat_param.grad.numel() for u in units if u._handle.flat_param.grad is not None)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)  # this rank's shard of each
    if held > 2 * trainable:
        return Observation("wrong", f"no error raised, but this rank holds {held:,} gradient elements for "
                                    f"{trainable:,} trainable ones ({held / trainable:.1f}x)")
    return Observation("ok", f"gradient buffers hold {held:,} elements for {trainable:,} trainable ones")


@case("fsdp1-mixed-dtype", LORA.replace(engine="fsdp1", mixed_param_dtypes=True, precision="bf16-mixed"), ranks=2)
def fsdp1_mixed_dtype_wrap(setup: Combination, ctx: Context) -> Observation:
    """FSDP1 (one unit per decoder layer) around a bf16 Llama whose LoRA adapters PEFT keeps in float32
    (autocast_adapter_dtype), then one step; gradients compared with the reference within bf16 tolerance"""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = _fsdp1(setup, dtype=torch.bfloat16 if setup.mixed_param_dtypes else torch.float32)
    batch = token_batch()
    model(**batch, use_cache=setup.use_cache).loss.backward()
    with FSDP.summon_full_params(model, with_grads=True):
        grads = full_grads(model)
    return compare(grads, reference_grads(setup, batch), tolerance=5e-2)


@case("zero3-lora-merge", ZERO3.replace(merge_in_sharded=True, adapter_save_gather=True), ranks=2, requires=DS)
def zero3_merge(setup: Combination, ctx: Context) -> Observation:
    """a LoRA model under ZeRO-3, merged with merge_and_unload either on its partitions or inside
    GatheredParameters; the merged model's logits compared with the same merge in one process"""
    import deepspeed

    engine = deepspeed_engine(_model(setup), setup)
    batch = token_batch()
    params = list(engine.module.parameters())
    # Gathering is collective: every rank enters it; modifier_rank keeps rank 0's merged values.
    with deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=not setup.merge_in_sharded):
        merged = engine.module.merge_and_unload()
        with torch.no_grad():
            logits = merged(**batch, use_cache=False).logits if not setup.merge_in_sharded else None
    if logits is None:
        with torch.no_grad():
            logits = engine(**batch, use_cache=False).logits
    reference = _model(setup.replace(merge_in_sharded=False)).merge_and_unload()
    with torch.no_grad():
        expected = reference(**batch, use_cache=False).logits
    diff = float((logits - expected).abs().max())
    if diff > 1e-4:
        return Observation("wrong", f"no error raised, but the merged model's logits differ by {diff:.3g}")
    return Observation("ok", f"merged logits equal the single-process merge (max difference {diff:.1e})")


@case("fsdp2-generate-unsharded", LORA.replace(engine="fsdp2", stage="grpo", generation=True, use_cache=False),
      ranks=2)
def fsdp2_generate(setup: Combination, ctx: Context) -> Observation:
    """greedy generate() of 6 tokens from an FSDP2-sharded LoRA Llama, with its parameters unsharded for the
    rollout or not; tokens compared with the same generate() in one process"""
    model = fsdp2_shard(_model(setup), setup)
    prompt = torch.randint(3, 96, (1, 4), generator=torch.Generator().manual_seed(7))
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    model.eval()
    if setup.generation_gather:
        model.unshard()  # the root unit: every parameter gathered once for the whole rollout
    with torch.no_grad():
        tokens = model.generate(input_ids=prompt, **kwargs)
    if setup.generation_gather:
        model.reshard()
    reference = _model(setup).eval()
    with torch.no_grad():
        expected = reference.generate(input_ids=prompt, **kwargs)
    if not torch.equal(tokens, expected):
        return Observation("wrong", f"no error raised, but generated {tokens.tolist()} instead of "
                                    f"{expected.tolist()}")
    return Observation("ok", f"generated the single-process tokens {tokens[0, 4:].tolist()}")


@case("zero3-init-adapter-read", ZERO3.replace(world_size=1, adapter_reads_base="svd"), ranks=1, requires=DS)
def pissa_on_partitioned_weights(setup: Combination, ctx: Context) -> Observation:
    """LoRA initialized from the base weights' SVD (PiSSA: adapter_reads_base svd) on a tiny Llama whose weights
    zero.Init has partitioned into [0] placeholders, as from_pretrained under ZeRO-3 leaves them (one rank; peft
    sees ZeRO-3 as the HF Trainer shows it); the adapters compared with PiSSA's on the whole weights"""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from loraflow.engines.launch import init_distributed
    from loraflow.probes.tiny import TARGETS

    init_distributed("gloo")
    init = "pissa" if setup.adapter_reads_base == "svd" else True

    def adapters(partitioned: bool) -> dict:
        model = tiny_llama(use_cache=False)
        if partitioned:
            zero3_partition(model, setup)
        torch.manual_seed(1)
        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=init)
        with zero3_visible_to_peft(zero_config(setup), enabled=partitioned):
            peft_model = get_peft_model(model, config)  # an SVD of a [0] placeholder raises here
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}

    got, expected = adapters(True), adapters(False)
    worst = max(float((got[k] - v).norm() / v.norm().clamp_min(1e-12)) for k, v in expected.items())
    if worst > 1e-4:
        return Observation("wrong", f"no error raised, but the adapters built on the partitioned model differ from "
                                    f"those built on the whole weights by relative error {worst:.3g}")
    return Observation("ok", f"{len(got)} adapter tensors equal those built on the whole weights (max relative error "
                             f"{worst:.1e}): peft gathered each weight for its SVD")
