"""Resumable checkpoints, written so that a crash never leaves a broken one behind.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` holding the adapter in PEFT format
(adapter_config.json + adapter_model.safetensors, loadable with PeftModel.from_pretrained; the whole model for
full fine-tuning) and trainer_state.pt (optimizer, scheduler, RNG, data position). It is written into a
temporary directory, fsynced, and renamed into place; `latest` is updated only afterwards, by an atomic replace.
A kill at any moment leaves either the old checkpoint or the new one, never half of one; leftovers of an
interrupted save are removed on the next save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from loraflow.errors import CheckpointError

MARKER = "checkpoint.json"  # written last inside the temporary dir: its presence means complete
EXTRA_WEIGHTS = "extra_weights.safetensors"
"""Trained tensors outside the PEFT adapter (PPO's value head), kept beside it so the adapter stays loadable
by peft.PeftModel.from_pretrained on the plain base model."""


def extra_trainable(model, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """Tensors of `state` that PEFT's save leaves out: trainable parameters that are neither adapter weights nor
    a modules_to_save copy. Empty for full fine-tuning (the whole model is saved)."""
    from peft import PeftModel

    if not isinstance(model, PeftModel) or not state:
        return {}
    return {k: v for k, v in state.items() if "lora_" not in k and ".modules_to_save." not in k}


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_weights(model: torch.nn.Module, directory: Path, state: dict[str, torch.Tensor] | None = None,
                 tokenizer=None) -> None:
    """The trained weights in the format their users expect: a PEFT adapter, or a whole HF model. `state` holds
    full tensors gathered by the engine (a sharded module's own tensors are partitions or placeholders); PEFT
    keeps only the adapter's keys of it."""
    model.save_pretrained(directory, safe_serialization=True, state_dict=state)
    extras = extra_trainable(model, state)
    if extras:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in extras.items()}, str(directory / EXTRA_WEIGHTS))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def _publish(tmp: Path, final: Path) -> None:
    """Make the complete directory `tmp` appear as `final`. An existing `final` is renamed aside first and
    deleted only after the new one is in place, so it is never deleted before its replacement exists."""
    _fsync_tree(tmp)
    stale = final.with_name(f".tmp-old-{final.name}-{os.getpid()}")
    if final.exists():
        os.rename(final, stale)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(stale, ignore_errors=True)


def export_weights(model: torch.nn.Module, directory: Path, state: dict[str, torch.Tensor] | None = None,
                   tokenizer=None) -> None:
    """Write the final weights next to the checkpoints with the same all-or-nothing rename (one process)."""
    tmp = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(model, tmp, state, tokenizer)
    _publish(tmp, directory)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, weights: dict[str, torch.Tensor] | None,
                    trainer_state: dict[str, Any], keep: int, engine=None) -> Path:
    """Every rank calls this (collective with an engine). Rank 0 writes the weights (already gathered) and the
    trainer state; an engine with per-rank state (DeepSpeed) writes its files into the same temporary directory
    first. The directory name is the same on every rank, so they agree on where to write."""
    main = engine is None or engine.rank == 0
    sync = engine.barrier if engine is not None else (lambda: None)
    root = run_dir / "checkpoints"
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(".tmp-*"):  # an earlier save that was killed midway
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir()
    sync()
    if engine is not None:
        engine.save_engine_files(tmp)
    sync()
    if main:
        save_weights(model, tmp, weights)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        (tmp / MARKER).write_text(json.dumps({"step": step, "files": sorted(p.name for p in tmp.iterdir())}))
        _publish(tmp, final)  # also covers re-saving a step (a resumed run that ends where it resumed)
        write_atomic_text(run_dir / "latest", final.name + "\n")
        for old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    sync()
    return final


def complete_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if is_complete(p)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def is_complete(path: Path) -> bool:
    """The marker exists and every file it lists is present."""
    try:
        listed = json.loads((path / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return False
    return all((path / name).exists() for name in listed)


def latest_checkpoint(run_dir: Path) -> Path:
    """The checkpoint `latest` names, or else the newest complete one."""
    pointer = run_dir / "latest"
    if pointer.is_file():
        candidate = run_dir / "checkpoints" / pointer.read_text().strip()
        if is_complete(candidate):
            return candidate
    found = complete_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"{run_dir} has no complete checkpoint to resume from. Start a new run without "
                              "--resume, or set output.save_every_steps so runs leave checkpoints.")
    return found[-1]


def load_checkpoint(path: Path, model) -> dict[str, Any]:
    """Load weights into `model` (in place) and return the trainer state."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(adapter))
        missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k or "modules_to_save" in k]
        wrong = getattr(result, "unexpected_keys", None) or missing
        if wrong:
            raise CheckpointError(f"{adapter} does not fit this model's adapter ({wrong[0]}); adapter.method, "
                                  "adapter.target_modules or adapter.train_modules differ from the checkpoint's run.")
        if (path / EXTRA_WEIGHTS).is_file():
            _, unexpected = model.load_state_dict(load_file(path / EXTRA_WEIGHTS), strict=False)
            if unexpected:
                raise CheckpointError(f"{path / EXTRA_WEIGHTS} does not fit this model ({unexpected[0]}).")
    else:
        state = {}
        for shard in sorted(path.glob("model*.safetensors")):
            state.update(load_file(shard))
        if not state:
            raise CheckpointError(f"{path} holds neither an adapter nor model weights.")
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise CheckpointError(f"{path} does not fit this model (unexpected key {unexpected[0]}).")
    return torch.load(path / "trainer_state.pt", weights_only=False)
