"""Process-group start-up for torchrun and the deepspeed launcher (both export RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT). One process with a distributed engine gets a one-rank group of its own."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def distributed_env() -> DistEnv:
    return DistEnv(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str = "auto", timeout_minutes: float = 30) -> DistEnv:
    """Join the launcher's process group (idempotent). `auto`: nccl with CUDA, gloo otherwise."""
    env = distributed_env()
    if dist.is_initialized():
        return env
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if "MASTER_ADDR" not in os.environ:  # one process, no launcher: a private one-rank group
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return env
