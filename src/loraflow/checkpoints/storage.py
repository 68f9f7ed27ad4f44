"""The run directory as a disk: can it be written, is there room for the next save, and what a failed write means.

Writers report a full disk in three different ways, so a failed save is classified here once:
- Python's own writes raise OSError with errno ENOSPC (28), EDQUOT (122) or EFBIG (27, a file size limit);
- safetensors (Rust) raises SafetensorError("Error while serializing: I/O error: No space left on device (os error
  28)"): the errno survives only inside the message;
- torch.save's C++ zip writer (caffe2/serialize/inline_container.cc, PyTorchStreamWriter over std::ofstream) keeps
  no errno at all: a short write surfaces as RuntimeError "[enforce fail at inline_container.cc:672] . unexpected
  pos 576 vs 534", or "PytorchStreamWriter failed writing file ...: file write failed". Nothing else in a save
  makes it fail that way, so it is read as a full disk (or a quota, or a file size limit: they look the same).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from loraflow.errors import DiskFullError, LoraflowError, OutputError

NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
TORCH_SHORT_WRITE = ("PytorchStreamWriter failed", "unexpected pos")
SLACK = 256 * 1024
"""Added to every estimate: the small files beside the tensors (configs, README, marker, tokenizer) and a block
per file on file systems that allocate whole blocks."""
FIX_SPACE = ("Free space on that disk, lower output.keep_checkpoints (older checkpoints are deleted only after a "
             "new one is complete, so each save needs room for one more), or set output.dir to a disk with room "
             "(to continue this run there, copy its directory over and --resume the copy).")


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable; keeps type checkers calm


def existing_ancestor(path: Path) -> Path:
    """`path` or its nearest existing parent: the file system a directory not yet created will live on."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing_ancestor(path)).free


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors inside nested dicts, lists and tuples (an optimizer state_dict, a trainer state)."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def ensure_space(directory: Path, need: int, what: str, kept: str) -> None:
    """Refuse a save before it writes anything when the disk holding `directory` has less than `need` free."""
    free = free_bytes(directory)
    if need > free:
        raise DiskFullError(f"not enough space to write {what} in {directory}: it needs about {human(need)} and "
                            f"{human(free)} are free. Nothing was written; {kept}. {FIX_SPACE}")


def _errno(exc: BaseException) -> int | None:
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    found = RUST_OS_ERROR.search(str(exc))  # safetensors: the errno is only in the message
    return int(found.group(1)) if found else None


def write_failure(exc: BaseException, directory: Path, what: str, kept: str) -> OutputError | None:
    """The clear error for a write that failed because of the disk, or None when `exc` is something else."""
    if isinstance(exc, LoraflowError):
        return None  # already says what is wrong
    code = _errno(exc)
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if code in NO_SPACE or (isinstance(exc, RuntimeError) and any(s in str(exc) for s in TORCH_SHORT_WRITE)):
        if code == errno.EFBIG:
            cause = "the file grew past a size limit (File too large: ulimit -f, or the file system's largest file)"
        elif code is not None:
            cause = os.strerror(code)
        else:
            cause = (f"torch's writer stopped part-way ({first_line}), which is how it reports a full disk, a quota "
                     "or a file size limit")
        return DiskFullError(f"no space left on device while writing {what} to {directory}: {cause}; "
                             f"{human(free_bytes(directory))} free now. The partial files were removed; {kept}. "
                             f"{FIX_SPACE}")
    if code in NOT_WRITABLE:
        name = getattr(exc, "filename", None) or directory
        return OutputError(f"cannot write {what} to {directory}: {os.strerror(code)} ({name}). Set output.dir to a "
                           "directory this user can write to, or fix its permissions (or remount it read-write). "
                           f"Nothing was written; {kept}.")
    return None


@contextlib.contextmanager
def translated_writes(directory: Path, what: str, kept: str) -> Iterator[None]:
    """Raise the clear LoraflowError for a disk failure inside the block (the original stays as its cause)."""
    try:
        yield
    except Exception as exc:
        clear = write_failure(exc, directory, what, kept)
        if clear is None:
            raise
        # torch.save's frames hold its zip writer, whose open file keeps the (already deleted) partial file's
        # blocks allocated for as long as this exception lives; clearing their locals closes it now.
        _clear_frames(exc)
        raise clear from exc


def _clear_frames(exc: BaseException | None, depth: int = 0) -> None:
    """Clear the locals of every finished frame in `exc`'s traceback and in those of the exceptions it chains."""
    if exc is not None and depth < 8:
        traceback.clear_frames(exc.__traceback__)
        _clear_frames(exc.__context__, depth + 1)
        _clear_frames(exc.__cause__, depth + 1)


def check_writable(directory: Path) -> None:
    """Create `directory` if needed and write a probe file into it, so that a run whose output cannot be written
    stops before it loads data and a model instead of at its first checkpoint."""
    directory = Path(directory)
    probe = directory / f".loraflow-write-probe-{os.getpid()}"
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"output directory {directory} is a file, not a directory. Set output.dir to a directory "
                          "(it is created if missing).")
    try:
        with translated_writes(directory, "the run's files", "nothing of the run has started"):
            directory.mkdir(parents=True, exist_ok=True)
            with probe.open("wb") as fh:
                fh.write(b"loraflow")
                fh.flush()
                os.fsync(fh.fileno())
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
