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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- launching local multi-process jobs (probes, the engine cross-check, tests) --------------------------------


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for local ranks on CPU: one thread each (two ranks on two cores with more threads made a
    rank 20x slower here), DeepSpeed's CPU accelerator, and LOCAL_SIZE, which DeepSpeed 0.15.3 needs without
    numactl."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", LOCAL_SIZE=env.get("LOCAL_SIZE", "2"),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def torchrun_argv(nproc: int, tail: list[str], python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run` on this machine with a free port; `tail` is `-m module args...`."""
    import sys

    return [python or sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
            str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *tail]


def run_isolated(argv: list[str], log, timeout: float, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> int | None:
    """Run in a new session, output to the file `log`, and on timeout kill the whole process group (torchrun's
    ranks would otherwise outlive their launcher). Returns the exit code, or None after a timeout."""
    import signal
    import subprocess

    with open(log, "w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env or launch_env(),
                                start_new_session=True, cwd=cwd)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


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
        # ... and the variables a launcher would set, which DeepSpeed asserts on (LOCAL_RANK) even for one rank.
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return env
