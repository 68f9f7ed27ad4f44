"""Resumable checkpoints, written so that a crash never leaves a broken one behind, and checked before use.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` holding the adapter in PEFT format
(adapter_config.json + adapter_model.safetensors, loadable with PeftModel.from_pretrained; the whole model for
full fine-tuning) and trainer_state.pt (optimizer, scheduler, RNG, data position). It is written into a
temporary directory, fsynced, and renamed into place; `latest` is updated only afterwards, by an atomic replace.
A kill at any moment leaves either the old checkpoint or the new one, never half of one; leftovers of an
interrupted save are removed on the next save.

What the disk can do wrong is handled too. Before writing, the weights must be finite and the disk must have
room (storage.py); a write that fails anyway (a full disk, a read-only file system) becomes one clear error, its
temporary directory is removed and the previous checkpoint and `latest` stay as they were. Every file's size and
sha256 go into the marker (integrity.py); resuming takes the newest checkpoint that verifies and moves a
damaged one aside as `corrupt-step-NNNNNNN`, never deleting it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from loraflow import errors
from loraflow.checkpoints.integrity import MARKER, problems, require_finite, seal, weights_view
from loraflow.errors import CheckpointError
from loraflow.checkpoints.storage import SLACK, directory_bytes, ensure_space, tensor_bytes, translated_writes

log = logging.getLogger("loraflow")
EXTRA_WEIGHTS = "extra_weights.safetensors"
"""Trained tensors outside the PEFT adapter (PPO's value head), kept beside it so the adapter stays loadable
by peft.PeftModel.from_pretrained on the plain base model."""
KEPT = "the previous checkpoint and `latest` are untouched"
CORRUPT = "corrupt-"  # prefix of a damaged checkpoint moved aside: outside the step-* glob, so never counted


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
    try:
        with translated_writes(path.parent, path.name, f"{path.name} is as it was"):
            tmp.write_text(text)
            with tmp.open("rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
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


def publish_dir(tmp: Path, final: Path) -> None:
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
    """Write the final weights next to the checkpoints with the same all-or-nothing rename (one process), after
    checking they are finite and fit on the disk."""
    what, kept = f"the final weights ({directory.name})", f"any earlier {directory} is untouched"
    view = weights_view(model, state)
    require_finite(view, what, kept)
    ensure_space(directory.parent, tensor_bytes(view) + SLACK, what, kept)
    tmp = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
    try:
        with translated_writes(directory.parent, what, kept):
            shutil.rmtree(tmp, ignore_errors=True)
            save_weights(model, tmp, state, tokenizer)
            publish_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a publish; the partial files after a failure


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
    """Every rank calls this (collective with an engine). Rank 0 checks the weights and the free space, then
    writes the weights (already gathered) and the trainer state; an engine with per-rank state (DeepSpeed) writes
    its files into the same temporary directory first. The directory name is the same on every rank, so they agree
    on where to write. After each phase the ranks agree on whether one failed, so a failure on one rank becomes the
    same error on all of them instead of a hang at the next barrier."""
    main = engine is None or engine.rank == 0
    root = run_dir / "checkpoints"
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}"
    what = f"checkpoint {final.name}"

    def attempt(phase: Callable[[], None]) -> Exception | None:
        try:
            with translated_writes(root, what, KEPT):
                phase()
        except Exception as exc:  # handed to _agree, which raises it once every rank has heard of it
            return exc
        return None

    def begin() -> None:
        view = weights_view(model, weights)
        require_finite(view, what, KEPT)  # before anything is written: a NaN checkpoint must not replace a good one
        previous = complete_checkpoints(run_dir)
        # Tensors undercount an engine's own files (DeepSpeed's optimizer partitions); the previous checkpoint
        # measures those, once there is one.
        need = max(tensor_bytes(view) + tensor_bytes(trainer_state), directory_bytes(previous[-1]) if previous else 0)
        ensure_space(root, need + SLACK, what, KEPT)
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(".tmp-*"):  # an earlier save that was killed midway
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir()

    def finish() -> None:
        save_weights(model, tmp, weights)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        # Hashed now, while the directory is private to this save: every rank's files are in it and final.
        (tmp / MARKER).write_text(json.dumps({"step": step, "files": seal(tmp)}, indent=1))
        publish_dir(tmp, final)  # also covers re-saving a step (a resumed run that ends where it resumed)
        write_atomic_text(run_dir / "latest", final.name + "\n")
        for old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    _agree(engine, tmp if main else None, attempt(begin) if main else None)
    _agree(engine, tmp if main else None,
           attempt(lambda: engine.save_engine_files(tmp)) if engine is not None else None)
    _agree(engine, tmp if main else None, attempt(finish) if main else None)
    return final


def _agree(engine, tmp: Path | None, failure: Exception | None) -> None:
    """Raise on every rank when any rank failed (collective with an engine); the rank holding the temporary
    directory removes what the failed save left in it."""
    if engine is None:
        failed = [(0, failure)] if failure is not None else []
    else:
        told = engine.gather_objects(None if failure is None else (type(failure).__name__, str(failure)))
        failed = [(rank, got) for rank, got in enumerate(told) if got is not None]
    if not failed:
        return
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    if failure is not None:
        raise failure
    rank, (kind, message) = failed[0]
    cls = getattr(errors, kind, None)
    cls = cls if isinstance(cls, type) and issubclass(cls, errors.LoraflowError) else CheckpointError
    raise cls(f"rank {rank} could not write the checkpoint: {message}")


def _step(path: Path) -> int | None:
    number = path.name.removeprefix("step-")
    return int(number) if path.name.startswith("step-") and number.isdigit() else None


def complete_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if _step(p) is not None and is_complete(p)]
    return sorted(found, key=_step)


def is_complete(path: Path) -> bool:
    """The marker exists and every file it lists is present (cheap: sizes and checksums are `problems`')."""
    try:
        listed = json.loads((path / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((path / name).exists() for name in listed)  # a dict (name -> size, sha256) iterates its names


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint that verifies (sizes and checksums, or a read of each file for one written before
    checksums existed). Newer ones that do not are moved aside, each with a warning naming the file, what is
    wrong with it and the step resumed instead. Selection, not loading, is where the fallback lives: load_checkpoint
    loads the checkpoint it is given, and a user naming one should never silently get another."""
    root = run_dir / "checkpoints"
    candidates = sorted((p for p in root.glob("step-*") if _step(p) is not None and p.is_dir()),
                        key=_step, reverse=True) if root.is_dir() else []
    damaged: list[tuple[Path, list[tuple[Path, str]]]] = []
    for path in candidates:
        found = problems(path)
        if not found:
            for bad, what in damaged:
                log.warning("checkpoint %s is damaged: %s; falling back to step %d (%s). %s", bad.name,
                            _describe(what), _step(path), path, _set_aside(bad))
            return path
        damaged.append((path, found))
    if damaged:
        listed = "; ".join(f"{bad.name}: {_describe(what)}" for bad, what in damaged)
        kept = " ".join(_set_aside(bad) for bad, _ in damaged)
        raise CheckpointError(f"no checkpoint in {root} can be resumed from: {listed}. {kept} Start a new run "
                              "without --resume (or restore a copy of the checkpoints directory).")
    raise CheckpointError(f"{run_dir} has no complete checkpoint to resume from. Start the run again in place with "
                          f"--restart {run_dir} instead of --resume, and set output.save_every_steps so runs leave "
                          "checkpoints.")


def _describe(found: list[tuple[Path, str]]) -> str:
    return ", ".join(f"{f} {what}" for f, what in found)


def _set_aside(path: Path) -> str:
    """Move a damaged checkpoint out of the step-* names, keeping its data: counted as one of
    output.keep_checkpoints it would push a good one out, and a resumed run re-saving its step would delete it.
    Only rank 0 moves it (RANK is set by every launcher); the others see it missing, which is the same verdict."""
    if os.environ.get("RANK", "0") != "0":
        return f"It is left in place for rank 0 to move aside as {CORRUPT}{path.name}."
    target, n = path.with_name(CORRUPT + path.name), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{CORRUPT}{path.name}-{n}")
    try:
        os.rename(path, target)
    except OSError as exc:
        return f"It could not be moved aside ({exc.strerror}); it is left as it is."
    return f"It is kept, moved aside as {target}."


def _read(f: Path, reader: Callable[[], Any]) -> Any:
    """`reader()`, with a damaged file (truncated, or from before checksums existed) reported by name."""
    try:
        return reader()
    except Exception as exc:  # safetensors, torch's zip reader and pickle each fail differently on the same damage
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{f} cannot be read ({first}): the checkpoint is damaged. Move {f.parent} aside and "
                              "resume again: --resume takes the newest checkpoint that verifies.") from exc


def load_checkpoint(path: Path, model) -> dict[str, Any]:
    """Load weights into `model` (in place) and return the trainer state."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, _read(adapter, lambda: load_file(adapter)))
        missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k or "modules_to_save" in k]
        wrong = getattr(result, "unexpected_keys", None) or missing
        if wrong:
            raise CheckpointError(f"{adapter} does not fit this model's adapter ({wrong[0]}); adapter.method, "
                                  "adapter.target_modules or adapter.train_modules differ from the checkpoint's run.")
        extra = path / EXTRA_WEIGHTS
        if extra.is_file():
            _, unexpected = model.load_state_dict(_read(extra, lambda: load_file(extra)), strict=False)
            if unexpected:
                raise CheckpointError(f"{extra} does not fit this model ({unexpected[0]}).")
    else:
        state = {}
        for shard in sorted(path.glob("model*.safetensors")):
            state.update(_read(shard, lambda shard=shard: load_file(shard)))
        if not state:
            raise CheckpointError(f"{path} holds neither an adapter nor model weights.")
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise CheckpointError(f"{path} does not fit this model (unexpected key {unexpected[0]}).")
    trainer_state = path / "trainer_state.pt"
    return _read(trainer_state, lambda: torch.load(trainer_state, weights_only=False))
