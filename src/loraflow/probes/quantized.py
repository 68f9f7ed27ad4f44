"""Reproductions of the quantized-base (QLoRA) rules: a tiny Llama saved and loaded back in 4 bits by bitsandbytes,
on the CPU, one process or two (FSDP2 on gloo)."""

from __future__ import annotations

from pathlib import Path

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.tiny import quiet, tiny_llama, token_batch, with_adapters
from loraflow.rules.combination import Combination
from loraflow.setup.quantize import (
    Quantization,
    constants,
    keep_layout,
    quantized_linears,
)

BNB = ("bitsandbytes",)
QLORA = Combination(adapter="lora", matched_modules=14, quantization="4bit", cpu=True)


def quantized_tiny(ctx: Context, storage: torch.dtype = torch.uint8, dtype: torch.dtype = torch.float32,
                   cpu_repack: bool = False, intermediate: int = 128, method: str = "nf4"):
    """The probes' tiny Llama loaded in NF4 (double quantization, compute in `dtype`), or in 8 bits with
    `method="int8"`. `intermediate` not a multiple of 64 gives down_proj an input width bitsandbytes' CPU repack
    cannot convert."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    where = [str(Path(ctx.workdir) / f"tiny-{intermediate}")]
    if dist.is_initialized():
        dist.broadcast_object_list(where, src=0)  # each rank has its own workdir; rank 0's holds the model
    path = Path(where[0])
    if ctx.rank == 0 and not (path / "config.json").is_file():  # transformers saves on the main process only
        model = tiny_llama(use_cache=False)
        if intermediate != model.config.intermediate_size:
            from transformers import LlamaConfig, LlamaForCausalLM

            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), "intermediate_size": intermediate}))
        model.save_pretrained(path)
    if dist.is_initialized():
        dist.barrier()  # load once rank 0 has written it
    q = Quantization(method, method != "int8", dtype, storage, ("lm_head",), cpu_repack=cpu_repack)
    with quiet():
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=q.hf_config(), device_map={"": "cpu"},
                                                     dtype=dtype)
    keep_layout(model, q)
    return model


def _snapshot(model) -> dict[str, list[torch.Tensor]]:
    return {n: [m.weight.data.clone(), *(t.clone() for t in constants(m.weight))]
            for n, m in quantized_linears(model).items()}


@case("kbit-cpu-repack", QLORA, requires=BNB)
def cpu_repack_eval(setup: Combination, ctx: Context) -> Observation:
    """a 4-bit tiny Llama (down_proj 96 wide) run in eval mode under no_grad, as evaluation does, bitsandbytes' CPU
    repack left on or off; then its packed weights and scales compared with those it was loaded with"""
    from bitsandbytes.functional import has_avx512bf16

    if not has_avx512bf16():
        return Observation("n/a", "this CPU has no AVX512-BF16, so bitsandbytes never takes its CPU repack path")
    model = quantized_tiny(ctx, cpu_repack=setup.quant_cpu_repack, intermediate=96)
    before = _snapshot(model)
    model.eval()
    with torch.no_grad():
        model(**token_batch(), use_cache=False)  # raises on the 96-wide down_proj when the repack is on
    after = _snapshot(model)
    changed = [n for n in before if any(not torch.equal(a, b) or a.dtype != b.dtype
                                        for a, b in zip(before[n], after[n]))]
    if changed:
        return Observation("wrong", f"no error raised, but {len(changed)} frozen 4-bit layers were rewritten in "
                                    f"place by the evaluation forward (first: {changed[0]})")
    return Observation("ok", f"{len(before)} 4-bit layers bit-identical after an eval-mode forward")


@case("kbit-full-finetune", QLORA.replace(adapter="full", matched_modules=None), requires=BNB)
def train_quantized_weights(setup: Combination, ctx: Context) -> Observation:
    """every weight of a 4-bit tiny Llama marked trainable (full fine-tuning), one forward and backward"""
    model = quantized_tiny(ctx)
    for p in model.parameters():
        p.requires_grad_(True)  # uint8-packed 4-bit weights cannot require grad
    model(**token_batch(), use_cache=False).loss.backward()
    return Observation("ok", "every weight received a gradient")


@case("qlora-storage-dtype", QLORA.replace(world_size=2, engine="fsdp2", precision="bf16-mixed", cpu=False,
                                           quant_storage_matches=False), ranks=2, requires=BNB)
def fsdp2_storage_step(setup: Combination, ctx: Context) -> Observation:
    """LoRA on a 4-bit tiny Llama (bf16 base) sharded by FSDP2 with a bf16 MixedPrecisionPolicy, the packed weights
    stored in float32 (unlike the base) or in bf16 (like it); one forward and backward"""
    from loraflow.probes.distributed_engines import fsdp2_shard, full_grads

    storage = torch.bfloat16 if setup.quant_storage_matches else torch.float32
    model = quantized_tiny(ctx, storage=storage, dtype=torch.bfloat16)
    model = fsdp2_shard(with_adapters(model, setup), setup)
    model(**token_batch(), use_cache=False).loss.backward()
    grads = full_grads(model)
    missing = [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
    if missing:
        return Observation("wrong", f"no error raised, but {len(missing)} adapter tensors got no finite gradient")
    return Observation("ok", f"{len(grads)} adapter tensors with finite gradients, packed weights in {storage}")


@case("kbit-int8-fsdp1", QLORA.replace(quantization="8bit", engine="fsdp1", world_size=2, cpu=False), ranks=2,
      requires=BNB)
def fsdp1_int8_step(setup: Combination, ctx: Context) -> Observation:
    """LoRA on an 8-bit (LLM.int8) tiny Llama wrapped by FSDP1 on the CPU (one unit per decoder layer), one forward
    and backward"""
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = with_adapters(quantized_tiny(ctx, method="int8"), setup)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
    model(**token_batch(), use_cache=False).loss.backward()
    return Observation("ok", "the 8-bit layers were flattened into FSDP units and one step ran")


@case("kbit-int8-fsdp2", QLORA.replace(quantization="8bit", engine="fsdp2", world_size=2, cpu=False), ranks=2,
      requires=BNB)
def fsdp2_int8_step(setup: Combination, ctx: Context) -> Observation:
    """LoRA on an 8-bit (LLM.int8) tiny Llama sharded by FSDP2 on the CPU, one forward and backward"""
    from loraflow.probes.distributed_engines import fsdp2_shard

    model = fsdp2_shard(with_adapters(quantized_tiny(ctx, method="int8"), setup), setup)
    model(**token_batch(), use_cache=False).loss.backward()
    return Observation("ok", "the sharded 8-bit layers ran one step")
