"""Count what DeepSpeed's optimizer wrapper keeps for a LoRA model without ZeRO (rule zero0-frozen-master-copies):
fp32 master elements and Adam state elements, with the optimizer built over every parameter or the trainable ones.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 deepspeed --num_gpus 1 scripts/zero0_masters.py all
    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 deepspeed --num_gpus 1 scripts/zero0_masters.py trainable

Another release without touching the environment: `pip install --no-deps --target /tmp/ds0190 deepspeed==0.19.0`
and PYTHONPATH=/tmp/ds0190 in front of the command. Builds a tiny Llama from its config (nothing downloaded).
"""

from __future__ import annotations

import sys

import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main(mode: str) -> None:
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(target_modules=["q_proj", "v_proj"], r=4))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    params = model.parameters() if mode == "all" else [p for p in model.parameters() if p.requires_grad]
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    _, opt, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    masters = (sum(t.numel() for g in getattr(opt, "fp32_groups", []) for t in g)
               + sum(t.numel() for t in getattr(opt, "fp32_groups_flat", [])))
    state = sum(v.numel() for s in opt.optimizer.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    print(f"deepspeed {deepspeed.__version__}, optimizer over {mode} parameters: {type(opt).__name__}, "
          f"parameters {total} (trainable {trainable}), fp32 master elements {masters}, Adam state elements {state}")


if __name__ == "__main__":
    main(sys.argv[-1])  # the launcher puts --local_rank first
