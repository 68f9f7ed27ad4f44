"""Reproductions of where a model is placed when it loads, on 2 ranks (gloo, CPU): a model spread by device_map,
handed to accelerate in a distributed run."""

from __future__ import annotations

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.tiny import adapter_grads, tiny_llama, token_batch, with_adapters
from loraflow.rules.combination import Combination

# accelerate counts the entries of the model's device map, not the devices. transformers dispatches (and records the
# map) only for a map over several places, so on a CPU machine the head goes to disk, as device_map='auto' offloads
# what does not fit: the same dispatched model, with one entry per top-level module, that several GPUs give.
SPREAD_MAP = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
              "lm_head": "disk"}


@case("device-map-split-distributed", Combination(adapter="lora", matched_modules=14, world_size=2, engine="ddp",
                                                  model_split=True), ranks=2, requires=("accelerate",))
def spread_model_prepared(setup: Combination, ctx: Context) -> Observation:
    """a tiny Llama saved, loaded back with a device map of one entry per top-level module (what device_map='auto'
    gives on several GPUs, the head offloaded to disk) or on one device, given LoRA, prepared by accelerate on 2 CPU
    ranks and stepped once"""
    from accelerate import Accelerator
    from transformers import LlamaForCausalLM

    path = [f"{ctx.workdir}/tiny"]  # the workdirs are per rank: every rank loads rank 0's save
    if ctx.rank == 0:
        tiny_llama().save_pretrained(path[0])
    torch.distributed.broadcast_object_list(path, src=0)
    model = LlamaForCausalLM.from_pretrained(path[0], device_map=SPREAD_MAP if setup.model_split else {"": "cpu"},
                                             offload_folder=f"{ctx.workdir}/offload")
    model = with_adapters(model, setup)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(**token_batch()).loss
    accelerator.backward(loss)
    grads = adapter_grads(accelerator.unwrap_model(model))
    if not grads or any(g is None for g in grads.values()):
        return Observation("wrong", "an adapter got no gradient after the prepared step")
    return Observation("ok", f"accelerate prepared the model ({accelerator.distributed_type}) and it stepped")

