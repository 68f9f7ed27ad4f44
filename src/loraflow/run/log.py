"""Where a run's log lines go: the console (without tearing the progress bar) and the run directory's train.log,
with only rank 0 logging information in a distributed run. Other packages' warnings (bitsandbytes' notice about its
CPU kernels, printed at `import peft` on every command) go to train.log, never to the console."""

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


class _OtherPackages(logging.Handler):
    """On the root logger, where other packages' records end up (loraflow's own logger does not propagate once
    setup_logging ran). Their warnings are held until the run's train.log exists and then written there; a command
    without a run directory (check, merge, generate) drops them. Errors still reach the console, as do loraflow's
    own records logged before setup_logging (what logging's last-resort handler would have done with both).

    Why: such lines come at import time, before any run exists, and say nothing about the user's setup (peft imports
    bitsandbytes whenever it is installed, and bitsandbytes 0.50 then warns on CPUs with AVX512-BF16 that its
    optional `kernels` package is absent), yet they were the first line of every command."""

    HELD = 200
    """Records kept before train.log exists (import-time lines are a handful; a bound keeps a chatty package from
    growing memory in a long check)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.held: list[logging.LogRecord] = []
        self.file: logging.Handler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "loraflow" or record.name.startswith("loraflow.") or record.levelno >= logging.ERROR:
            if record.levelno >= logging.lastResort.level:
                logging.lastResort.handle(record)
        if record.name == "loraflow" or record.name.startswith("loraflow."):
            return
        if self.file is not None:
            self.file.handle(record)
        elif len(self.held) < self.HELD:
            self.held.append(record)

    def write_to(self, file: logging.Handler | None) -> None:
        """From now on into `file` (the run's train.log), the held records first; None: keep holding."""
        self.file = file
        if file is not None:
            for record in self.held:
                file.handle(record)
            self.held.clear()


def hold_other_packages_logs() -> None:
    """Install the root handler once per process (the CLI calls it first, before any other package is imported)."""
    root = logging.getLogger()
    if not any(isinstance(h, _OtherPackages) for h in root.handlers):
        root.addHandler(_OtherPackages())


def _other_packages_to(file: logging.Handler | None) -> None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _OtherPackages):
            handler.write_to(file)


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
        other = _QuietFileHandler(run_dir / "train.log")
        other.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(name)s] %(message)s"))
        _other_packages_to(other)
    import transformers

    transformers.logging.set_verbosity_error()  # their per-call warnings would drown the plan
    transformers.utils.logging.disable_progress_bar()
