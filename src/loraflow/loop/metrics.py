"""Metrics to run_dir/metrics.jsonl (one JSON object per event) and, optionally, TensorBoard and Weights & Biases.

A row is `{"kind": "train" | "eval" | "memory", "step": N, "time": T, <metric>: <value>, ...}`. A process killed
mid-write can leave a torn last line; readers drop it, and a resumed run cuts the file back to its checkpoint's step
(`truncate_after`) so the steps it replays are not logged twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from loraflow.errors import ConfigError, DataError

WANDB_MISSING = ("output.wandb={project!r} asks for Weights & Biases logging, but the `wandb` package is not "
                 "installed in this environment. Run `pip install wandb` (and `wandb login`), or unset output.wandb "
                 "(output.wandb=) to log only to metrics.jsonl and TensorBoard.")


def check_wandb(project: str) -> None:
    """Raise ConfigError when output.wandb is set but wandb cannot be imported; the plan/check can call it too."""
    if not project:
        return
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise ConfigError([WANDB_MISSING.format(project=project)])


class MetricsWriter:
    """Written by one process (rank 0 of a distributed run); `enabled=False` makes every call a no-op.
    `wandb_project` (config output.wandb) also sends every row to that W&B project, as a run named after the run
    directory."""

    def __init__(self, run_dir: Path, tensorboard: bool, enabled: bool = True, wandb_project: str = ""):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb_dir = Path(run_dir) / "tensorboard"
        self.enabled = enabled
        self._tb = None
        self._wandb = None
        if wandb_project:
            # Checked on every rank, so a misconfigured distributed run stops everywhere at once.
            check_wandb(wandb_project)
        if tensorboard and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.tb_dir))
        if wandb_project and enabled:
            import wandb

            # resume="allow" with the directory's name as id: a resumed run continues the same W&B run.
            self._wandb = wandb.init(project=wandb_project, name=Path(run_dir).resolve().name,
                                     id=_wandb_id(Path(run_dir)), resume="allow", dir=str(run_dir))

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"{kind}/{k}": v for k, v in numbers.items()}, step=step)

    def truncate_after(self, step: int) -> None:
        """Keep only the rows logged at or before `step` (the checkpoint a run resumes from), dropping a torn last
        line. Rewritten through a temporary file and os.replace, so a kill during it leaves the old file whole."""
        if not self.enabled or not self.path.is_file():
            return
        from loraflow.checkpoints.store import write_atomic_text

        kept = [row for row in _parse(self.path) if row.get("step", 0) <= step]
        write_atomic_text(self.path, "".join(json.dumps(row) + "\n" for row in kept))
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard's own way to forget the replayed steps: events after purge_step are hidden on reload.
            self._tb.close()
            self._tb = SummaryWriter(log_dir=str(self.tb_dir), purge_step=step + 1)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_id(run_dir: Path) -> str:
    """A W&B run id stable for this directory (ids allow only letters, digits, `-` and `_`)."""
    import hashlib

    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_dir.resolve().name)
    return f"{name[:48]}-{digest}"


def _parse(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # torn by a kill mid-write: that event was never completely logged
            raise DataError(f"{path}:{number}: not a JSON object ({line[:60]!r}...). Only the last line can be torn "
                            "by a kill; remove or fix this line.") from None
    return rows


def read_metrics(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in _parse(path) if kind is None or r["kind"] == kind]
