"""The processes of one run: joining the launcher's process group (when there is one, or the config asks for a
distributed engine), agreeing on the run's time stamp, waiting for every rank, and leaving the group at the end."""

from __future__ import annotations

import os
import time
from pathlib import Path

from loraflow.config import load_config
from loraflow.enginespec import wants_process_group
from loraflow.run.config import load_run_config


def join_process_group(stage: str, config_path: str | None, overrides: list[str],
                       resume: str | None) -> tuple[bool, str]:
    """Join the launcher's process group when there is one (or the config asks for a distributed engine), and
    agree on the run's time stamp. Returns (is rank 0, stamp). `resume` is the run directory of --resume or
    --restart: its saved config decides the engine."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    saved = Path(resume) / "config.yaml" if resume else None
    # A resumed run keeps its engine (only train/eval/output keys may change); a restarted one may change it.
    config_for_launch = load_config(saved, overrides) if saved is not None and saved.is_file() \
        else load_run_config(stage, config_path, overrides)
    if not wants_process_group(config_for_launch.parallel.engine, int(os.environ.get("WORLD_SIZE", "1"))):
        return True, stamp
    import torch.distributed as dist

    from loraflow.engines import init_distributed

    init_distributed(config_for_launch.parallel.backend)
    box = [stamp]
    dist.broadcast_object_list(box, src=0)  # every rank names a new run's directory as rank 0 does
    return dist.get_rank() == 0, box[0]


def wait_for_every_rank() -> None:
    """A barrier when several processes run; nothing for one."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def leave_process_group() -> None:
    """At the end of a run: every rank finishes its writes, then the group is destroyed."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
