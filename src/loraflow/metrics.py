"""Metrics to run_dir/metrics.jsonl (one JSON object per event) and, optionally, TensorBoard."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Written by one process (rank 0 of a distributed run); `enabled=False` makes every call a no-op."""

    def __init__(self, run_dir: Path, tensorboard: bool, enabled: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        if tensorboard and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]
