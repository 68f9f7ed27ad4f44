"""Checkpoints that vouch for themselves, and weights that are worth saving.

A checkpoint's marker (checkpoint.json) records every file's size and sha256. They are computed while the directory
is still temporary, after every rank has written into it, so an engine's own files (DeepSpeed's per-rank optimizer
partitions) are covered as well. Resuming recomputes them: a flipped bit, a truncated or a missing file shows up
before anything is loaded. A checkpoint written before checksums existed (its marker lists only names) is verified
the only way left: by reading each file as resuming will.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from loraflow.errors import NonFiniteError

MARKER = "checkpoint.json"  # written last inside the temporary dir: its presence means complete
CHUNK = 1 << 20
SHOWN = 5  # non-finite tensors named in an error; the count covers the rest


def _sha256(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
        if fsync:  # the same open file: one pass both hashes and flushes it to disk
            os.fsync(fh.fileno())
    return digest.hexdigest()


def seal(directory: Path) -> dict[str, dict[str, int | str]]:
    """Size and sha256 of every file under `directory` (relative POSIX paths), each fsynced as it is hashed."""
    files: dict[str, dict[str, int | str]] = {}
    for f in sorted(directory.rglob("*")):
        if f.is_file():
            files[f.relative_to(directory).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f, fsync=True)}
    return files


def problems(path: Path) -> list[tuple[Path, str]]:
    """What is wrong with checkpoint `path`, as (file, what) pairs; empty when it can be resumed from."""
    marker = path / MARKER
    try:
        listed = json.loads(marker.read_text())["files"]
    except FileNotFoundError:
        return [(marker, "is missing (the checkpoint was never completed)")]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [(marker, f"cannot be read ({exc})")]
    if isinstance(listed, dict):
        return [found for name, rec in listed.items() if (found := _checksum_problem(path / name, rec))]
    return [found for name in listed for f in _files(path / name) if (found := _read_problem(f))]


def _checksum_problem(f: Path, recorded: dict) -> tuple[Path, str] | None:
    try:
        size = f.stat().st_size
        if size != recorded["size"]:
            return f, f"size differs (recorded {recorded['size']} bytes, found {size})"
        actual = _sha256(f)
    except FileNotFoundError:
        return f, "is missing"
    except OSError as exc:
        return f, f"cannot be read ({exc.strerror or exc})"
    if actual != recorded["sha256"]:
        return f, f"checksum differs (sha256 recorded {recorded['sha256'][:12]}..., found {actual[:12]}...)"
    return None


def _files(path: Path) -> list[Path]:
    """A name a pre-checksum marker lists: a file, or a directory of files (an engine's own state)."""
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]


def _read_problem(f: Path) -> tuple[Path, str] | None:
    """A pre-checksum checkpoint's file, read the way resuming reads it; a truncated one fails here."""
    if not f.exists():
        return f, "is missing"
    try:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), "pt") as reader:
                for key in reader.keys():
                    reader.get_tensor(key)
        elif f.suffix in (".pt", ".bin", ".pth"):
            # mmap: the zip's directory sits at the end, so a truncated file fails without reading its tensors
            torch.load(f, map_location="cpu", weights_only=False, mmap=True)
        elif f.suffix == ".json":
            json.loads(f.read_text())
        else:
            f.read_bytes()
    except Exception as exc:  # any reader's failure means the same thing here: this file cannot be resumed from
        return f, f"cannot be read ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
    return None


def weights_view(model: torch.nn.Module, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The tensors a save writes: the gathered `state`, or what save_pretrained takes from the model itself."""
    if state is not None:
        return state
    from peft import PeftModel, get_peft_model_state_dict

    return get_peft_model_state_dict(model) if isinstance(model, PeftModel) else model.state_dict()


def _finite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True  # integer and quantized storage cannot hold NaN
    try:
        return bool(torch.isfinite(t).all())
    except (RuntimeError, NotImplementedError):  # float8 kinds have no isfinite kernel on some devices
        return bool(torch.isfinite(t.float()).all())


def require_finite(tensors: dict[str, torch.Tensor], what: str, kept: str) -> None:
    """Refuse to save weights holding NaN or Inf: a checkpoint of them would replace the last good one."""
    bad = [name for name, t in tensors.items() if torch.is_tensor(t) and not _finite(t)]
    if bad:
        shown = ", ".join(bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        raise NonFiniteError(f"refusing to write {what}: {len(bad)} of {len(tensors)} weight tensors hold NaN or Inf "
                             f"({shown}). Nothing was written; {kept}. The training diverged before this save: "
                             "lower train.learning_rate or keep train.max_grad_norm > 0 (precision.mode=bf16-mixed "
                             "keeps the adapters in fp32 where bf16 does not), and resume from the last good "
                             "checkpoint.")
