"""Save and reload a LoRA model's FSDP2 checkpoint the way the HF Trainer does (accelerate's save_fsdp_model /
load_fsdp_model with adapter_only=True, FULL_STATE_DICT) and count, per rank, the adapter shards that come back
(rule fsdp2-adapter-resume-lost). Each rank fills its own shard of every lora_ tensor with 1 + rank before saving and
zeroes it before loading.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/fsdp2_adapter_resume.py OUT_DIR

Another accelerate without touching the environment: `pip install --no-deps --target /tmp/acc114 accelerate==1.14.0`
and PYTHONPATH=/tmp/acc114 in front of the command. CPU and gloo: accelerate turns FSDP on for accelerator devices only,
so the script sets its FSDP state by hand (both PartialState's shared state and AcceleratorState's, as every
AcceleratorState() copies the former back). A tiny Llama built from its config; nothing is downloaded.
"""

from __future__ import annotations

import sys

import accelerate
import torch
import torch.distributed as dist
from accelerate import Accelerator, FullyShardedDataParallelPlugin, PartialState
from accelerate.utils import DistributedType, load_fsdp_model, save_fsdp_model
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main(out: str) -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="FULL_STATE_DICT",
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                            cpu_ram_efficient_loading=False)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    acc.state.distributed_type, acc.state.fsdp_plugin = DistributedType.FSDP, plugin
    rank = acc.process_index
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)  # FSDP2 prepares the model with its optimizer
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    with torch.no_grad():
        for p in lora:
            p.to_local().fill_(1.0 + rank)
    save_fsdp_model(acc.state.fsdp_plugin, acc, model, out, adapter_only=True)
    acc.wait_for_everyone()
    with torch.no_grad():
        for p in lora:
            p.to_local().zero_()
    load_fsdp_model(acc.state.fsdp_plugin, acc, model, out, adapter_only=True)
    back = sum(bool(torch.all(p.to_local() == 1.0 + rank)) for p in lora)
    for r in range(acc.num_processes):
        if r == rank:
            print(f"accelerate {accelerate.__version__}, rank {rank}: {back} of {len(lora)} adapter shards restored",
                  flush=True)
        dist.barrier()
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
