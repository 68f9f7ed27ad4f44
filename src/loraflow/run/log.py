"""Where a run's log lines go: the console (without tearing the progress bar) and the run directory's train.log,
with only rank 0 logging information in a distributed run."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from tqdm.auto import tqdm

log = logging.getLogger("loraflow")


class _TqdmHandler(logging.StreamHandler):
    """Console log lines that do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)


class _QuietFileHandler(logging.FileHandler):
    """train.log on a full disk: the lines are lost, but the console must not get a logging traceback per line
    (the error that follows says what happened)."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def setup_logging(run_dir: Path | None, verbose: bool = False, main: bool = True) -> None:
    """Console (and run_dir/train.log) logging. In a distributed run only rank 0 logs information; the other
    ranks print warnings and errors only, prefixed with their rank."""
    log.handlers.clear()
    log.setLevel(logging.DEBUG)
    log.propagate = False
    console = _TqdmHandler()
    console.setLevel((logging.DEBUG if verbose else logging.INFO) if main else logging.WARNING)
    if not main:
        console.setFormatter(logging.Formatter(f"[rank {os.environ.get('RANK', '?')}] %(message)s"))
        log.addHandler(console)
        run_dir = None  # one train.log per run: rank 0's
    else:
        console.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(console)
    if run_dir is not None:
        fh = _QuietFileHandler(run_dir / "train.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(fh)
    import transformers

    transformers.logging.set_verbosity_error()  # their per-call warnings would drown the plan
    transformers.utils.logging.disable_progress_bar()
