"""Reproductions of the number-format rules (catalog_precision.py): a model whose activations pass float16's range
trained under fp16 autocast with a loss scaler, and float32 adapters on a bfloat16 base without autocast. One
process, on the CPU (autocast runs float16 and bfloat16 there; the shapes are tiny, as bf16 matmuls are slow on a CPU
without bf16 units)."""

from __future__ import annotations

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.tiny import adapter_grads, tiny_llama, token_batch, with_adapters
from loraflow.rules.combination import Combination

LORA = Combination(adapter="lora", matched_modules=14)
OVERFLOW_SCALE = 2000.0
"""How much the first MLP's gate and up projections are scaled: their outputs reach a few hundred, and their
product passes float16's 65504 (a float32 or bfloat16 run holds it), as the families of families.FP16_OVERFLOW do
at full size with their own weights."""


def _overflowing_llama():
    model = tiny_llama(use_cache=False)
    with torch.no_grad():
        mlp = model.model.layers[0].mlp
        mlp.gate_proj.weight.mul_(OVERFLOW_SCALE)
        mlp.up_proj.weight.mul_(OVERFLOW_SCALE)
    return model


@case("fp16-overflow", LORA.replace(precision="fp16-mixed", fp16_overflows=True))
def fp16_scaled_steps(setup: Combination, ctx: Context) -> Observation:
    """three LoRA steps of a tiny Llama whose first MLP passes float16's range (fp16_overflows) or not, under the
    Combination's autocast with a dynamic loss scaler (a GradScaler for fp16), as the HF Trainer runs fp16"""
    model = with_adapters(_overflowing_llama() if setup.fp16_overflows else tiny_llama(use_cache=False), setup)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    fp16 = setup.precision in ("fp16", "fp16-mixed")
    scaler = torch.amp.GradScaler("cpu", enabled=fp16)
    dtype = torch.float16 if fp16 else torch.bfloat16 if setup.precision != "fp32" else None
    start, skipped, losses = scaler.get_scale() if fp16 else 1.0, 0, []
    for _ in range(3):
        before = [p.detach().clone() for p in trainable]
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(**token_batch(length=8), use_cache=False).loss
        scaler.scale(loss.float()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        skipped += all(torch.equal(a, p.detach()) for a, p in zip(before, trainable))
    if skipped or not all(torch.isfinite(torch.tensor(losses))):
        scale = f" (loss scale {start:g} -> {scaler.get_scale():g})" if fp16 else ""
        return Observation("wrong", f"no error raised, but the loss was {losses[-1]:g} and {skipped} of 3 updates "
                                    f"were skipped{scale}: the run learns nothing",
                           values={"skipped": skipped})
    return Observation("ok", f"3 updates taken, loss {losses[0]:.3f} -> {losses[-1]:.3f}", values={"skipped": 0})


@case("lora-dtype-mismatch", LORA.replace(precision="bf16", mixed_param_dtypes=True))
def float32_adapters_on_a_bf16_base(setup: Combination, ctx: Context) -> Observation:
    """float32 LoRA adapters (PEFT's autocast_adapter_dtype, mixed_param_dtypes) on a tiny Llama stored in bfloat16,
    one forward and backward without autocast; the adapters' gradients checked finite and float32"""
    model = with_adapters(tiny_llama(use_cache=False, dtype=torch.bfloat16), setup,
                          autocast_adapter_dtype=setup.mixed_param_dtypes)
    model(**token_batch(length=8), use_cache=False).loss.backward()  # a PEFT that does not cast raises here
    grads = adapter_grads(model)
    bad = [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
    if bad:
        return Observation("wrong", f"no error raised, but {len(bad)} of {len(grads)} adapter tensors got no finite "
                                    f"gradient (e.g. {bad[0]})")
    dtypes = sorted({str(g.dtype).removeprefix("torch.") for g in grads.values()})
    return Observation("ok", f"{len(grads)} adapter tensors with finite gradients ({', '.join(dtypes)}) on a bfloat16 "
                             "base: PEFT casts each LoRA layer's input to the adapter's dtype")
