"""Measure rule fsdp1-8bit-optimizer-save on the installed torch and bitsandbytes: two gloo ranks on CPU train a tiny
MLP under FSDP1 with bitsandbytes' AdamW8bit for one step, then gather the optimizer's state as a checkpoint does
(FSDP.optim_state_dict with FULL_STATE_DICT: what accelerate's save_fsdp_optimizer calls), with use_orig_params off
and on. Each is measured twice on one install: as bitsandbytes >= 0.49.2 ships it, and with torch's own
Optimizer.state_dict swapped in, which bitsandbytes inherited before PR #1840 wrapped its quantization tensors as
non-tensor state (0.49.2).

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/fsdp1_8bit_optimizer_save.py

Rank 0 prints one line per measurement: `use_orig_params=B bitsandbytes<0.49.2|>=0.49.2: saved N state tensors` or
`...: failed: <the exception>`.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist


def _tensors(value) -> int:
    if torch.is_tensor(value):
        return 1
    if isinstance(value, dict):
        return sum(_tensors(v) for v in value.values())
    return 0


def _measure(use_orig_params: bool, before_fix: bool) -> str:
    import bitsandbytes as bnb
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    # 128 x 128 weights: bitsandbytes keeps 8-bit state only for tensors of min_8bit_size (4096) elements or more
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
    model = FSDP(model, use_orig_params=use_orig_params, device_id=torch.device("cpu"))
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    if before_fix:
        opt.state_dict = torch.optim.Optimizer.state_dict.__get__(opt)
    model(torch.randn(4, 128)).pow(2).mean().backward()
    opt.step()
    configs = (FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
               FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True))
    label = f"use_orig_params={use_orig_params} bitsandbytes{'<' if before_fix else '>='}0.49.2"
    try:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, *configs):
            state = FSDP.optim_state_dict(model, opt)
        return f"{label}: saved {_tensors(state.get('state', {}))} state tensors"
    except Exception as exc:  # the failure measured: whatever the gather raises
        return f"{label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:240]}"


def main() -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    for use_orig_params in (False, True):
        for before_fix in (True, False):
            line = _measure(use_orig_params, before_fix)
            if dist.get_rank() == 0:
                print(line, flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
