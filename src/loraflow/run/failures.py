"""How a run that ends by an error says so: the error goes into train.log (so the log alone says how the run
ended, and `loraflow explain RUN/train.log` can read it), and a failed write of the run's own files (a full disk,
a directory made read-only under a running job) is said as what it is, with the fix, instead of as a bug."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("loraflow")


@contextlib.contextmanager
def failures_logged(run_dir: Path) -> Iterator[None]:
    """Around a run's body: an error that ends it is written to train.log, then raised (a failed write into
    run_dir as the storage error that names the fix, chained to the original)."""
    try:
        yield
    except Exception as exc:
        from loraflow.checkpoints.storage import write_failure

        # A full disk or a directory made read-only under a running job fails wherever the next write happens
        # (metrics, logs, summary): said as what it is, with the fix, instead of as a bug.
        clear = write_failure(exc, run_dir, "the run's files", "the checkpoints already written are intact") \
            if _under(getattr(exc, "filename", None), run_dir) else None
        log_fatal(clear or exc)
        if clear is not None:
            raise clear from exc
        raise
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: say how the run ended, then let it end
        log_fatal(exc)
        raise


def _under(filename: str | None, run_dir: Path) -> bool:
    """Whether a failed file operation was a write of this run (or names no file, as torch's short write does):
    a data file that cannot be read is not an output problem."""
    if filename is None:
        return True
    try:
        return Path(filename).resolve().is_relative_to(run_dir.resolve())
    except (OSError, ValueError):
        return False


def log_fatal(exc: BaseException) -> None:
    """The error that ends a run goes into train.log too (the console gets it from the CLI), so that the log
    alone says how the run ended and `loraflow explain RUN/train.log` can read it."""
    import traceback

    from loraflow.errors import LoraflowError

    files = [h for h in log.handlers if isinstance(h, logging.FileHandler)]
    if not files:
        return
    kind = "stopped" if getattr(exc, "exit_code", None) or isinstance(exc, KeyboardInterrupt) else "failed"
    head = f"run {kind}: {type(exc).__name__}: {exc}"
    trace = "" if isinstance(exc, LoraflowError) else "\n" + "".join(traceback.format_exception(exc)).rstrip()
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, head + trace, None, None)
    for handler in files:
        handler.handle(record)
