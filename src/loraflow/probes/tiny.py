"""Building blocks of the reproductions: a 2-layer Llama from a config, adapters, a step, and a comparison with
the unoptimized fp32 reference (no checkpointing, no cache, one process)."""

from __future__ import annotations

import contextlib
import warnings

import torch

from loraflow.probes.base import Observation
from loraflow.rules.combination import Combination

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MISMATCHED_TARGETS = ["fc1", "fc2"]  # OPT's MLP names: nothing in a Llama matches them
TOLERANCE = 1e-5


def tiny_llama(seed: int = 0, layers: int = 2, tie: bool = False, use_cache: bool = True, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie, use_cache=use_cache, attn_implementation="eager")
    return LlamaForCausalLM(cfg).to(dtype)


def with_adapters(model, setup: Combination, seed: int = 1, autocast_adapter_dtype: bool = True, **extra):
    """PEFT LoRA/DoRA on every projection (or on names that match nothing, for no-adapter-matched); lora_B is
    randomised so every adapter gets a non-zero gradient on the first step."""
    from peft import LoraConfig, get_peft_model

    if setup.adapter == "full":
        return model
    targets = MISMATCHED_TARGETS if setup.matched_modules == 0 else TARGETS
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                        use_dora=setup.adapter == "dora", **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=autocast_adapter_dtype)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return peft_model


def token_batch(seed: int = 3, rows: int = 2, length: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (rows, length), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def adapter_grads(model) -> dict[str, torch.Tensor | None]:
    return {n.replace("_checkpoint_wrapped_module.", ""): (None if p.grad is None else p.grad.detach().clone())
            for n, p in model.named_parameters() if p.requires_grad}


def compare(grads: dict, reference: dict, tolerance: float = TOLERANCE) -> Observation:
    """ok when every trainable gradient matches the reference; `wrong` names what went missing or how far off."""
    missing = [n for n, g in grads.items() if g is None]
    if missing:
        return Observation("wrong", f"no error raised, but {len(missing)} of {len(grads)} trainable tensors got no "
                                    f"gradient (e.g. {missing[0]})")
    worst, where = 0.0, ""
    for name, ref in reference.items():
        err = float((grads[name].float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
        if err > worst:
            worst, where = err, name
    if worst > tolerance:
        zero = sum(1 for g in grads.values() if g is not None and not g.any())
        return Observation("wrong", f"no error raised, but gradients are off by relative error {worst:.3g} "
                                    f"(worst {where}; {zero} tensors exactly zero)")
    return Observation("ok", f"gradients match the fp32 reference (max relative error {worst:.1e})")


@contextlib.contextmanager
def quiet():
    """Reproductions trigger the very warnings they study; keep them out of the table (the log keeps errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
