"""A run directory's lifecycle: a new run takes a new or empty directory, a resumed run reuses its saved config
(only the keys that do not shape the checkpoint may change), a restarted run (one that never wrote a checkpoint)
starts again in place with its earlier attempt's files set aside. Nothing of the user's there is ever moved or
written to."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from loraflow.config import Config, config_to_dict, load_config
from loraflow.errors import ConfigError
from loraflow.run.config import load_run_config

# Keys a resumed run may change: everything else shapes the adapter, the optimizer state or the data order,
# which were saved with the checkpoint (the optimizer state even restores its own learning rate).
RESUMABLE = ("eval.", "output.")
# Keys that shape the learning-rate schedule: the steps before the checkpoint followed it, so a resumed run that
# changed one would match neither the run it continues nor a run asked that way from the start. Only
# train.max_steps may change, and only with --extend (which says what it does with the schedule).
SCHEDULE = ("train.max_steps", "train.epochs", "train.learning_rate", "train.warmup_steps", "train.schedule")

# What a run writes into its directory; everything else there is the user's and is never moved or written to.
RUN_FILES = ("config.yaml", "plan.json", "train.log", "metrics.jsonl", "summary.json", "latest", "tensorboard",
             "checkpoints", "adapter", "model", "plots")
ATTEMPTS = "earlier-attempts"


def _flat(config: Config) -> dict[str, Any]:
    def walk(node: Any, prefix: str) -> dict[str, Any]:
        if isinstance(node, dict):
            return {k: v for key, sub in node.items() for k, v in walk(sub, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}

    return walk(config_to_dict(config), "")


def prepare_run(stage: str, config_path: str | None, overrides: list[str], resume: str | None,
                stamp: str | None = None, restart: str | None = None, extend: bool = False) -> tuple[Config, Path]:
    """Load the config and settle the run directory. A resumed run reuses the config saved in its directory; only
    eval.* and output.* may be overridden, and train.max_steps with `extend` (--extend). A restarted run (one that
    never wrote a checkpoint) reuses its saved config with any overrides, and its earlier attempt's files are kept
    aside. A new run never reuses a directory that holds one, or that holds anything at all. Nothing is written
    here (every rank reads the directory before any rank changes it: see `train`); config.yaml is saved once the
    run has really started. `stamp` names a new run's default directory; every rank of a run gets rank 0's."""
    if resume:
        run_dir = Path(resume)
        config = _resume_config(stage, resume, config_path, overrides, extend)
    elif restart:
        run_dir = Path(restart)
        config = _restart_config(run_dir, config_path, overrides)  # its files are set aside by `train`
    else:
        config = load_run_config(stage, config_path, overrides)
        run_dir = Path(config.output.dir or f"runs/{stage}-{stamp or time.strftime('%Y%m%d-%H%M%S')}")
        refuse_used_directory(run_dir)
    if config.stage != stage:
        raise ConfigError([f"the config says stage={config.stage}, but the command trains {stage}."])
    if config.output.wandb:  # before the model loads, not at the first metric
        from loraflow.loop.metrics import check_wandb

        check_wandb(config.output.wandb)
    config.output.dir = str(run_dir)
    return config, run_dir


def _resume_config(stage: str, resume: str, config_path: str | None, overrides: list[str],
                   extend: bool = False) -> Config:
    """The saved config of the run to continue, with the overrides a resumed run may take (RESUMABLE, and another
    train.max_steps with `extend`). `resume` is --resume's directory, quoted in the errors as the user wrote it."""
    run_dir = Path(resume)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError([f"--resume {resume}: no config.yaml there; is it a loraflow run directory?"])
    if config_path is not None:
        raise ConfigError([f"--resume reuses {saved}; pass only key=value overrides, not {config_path}."])
    before, config = load_config(saved), load_config(saved, overrides)
    old, new = _flat(before), _flat(config)
    changed = [k for k in new if new[k] != old.get(k)]
    problems = _schedule_problems(resume, [k for k in changed if k in SCHEDULE], old, new, extend)
    problems += _extend_past_checkpoint(run_dir, resume, new, extend)
    problems += [f"{k}={new[k]!r} cannot change when resuming (the run used {old.get(k)!r}): the checkpoint's "
                 "adapter, optimizer state and data order depend on it. Start a new run instead."
                 for k in changed if k == "output.dir" or not k.startswith(RESUMABLE + SCHEDULE)]
    if problems:
        raise ConfigError(problems)
    if not _has_checkpoint(run_dir):
        raise ConfigError([f"--resume {resume}: the run there stopped before it wrote any checkpoint, so there "
                           f"is nothing to continue. Start it again in place with `loraflow train {stage} "
                           f"--restart {resume}` (its earlier files are kept aside), and set "
                           "output.save_every_steps so a long run leaves checkpoints."])
    return config


def _schedule_problems(resume: str, changed: list[str], old: dict[str, Any], new: dict[str, Any],
                       extend: bool) -> list[str]:
    """Resuming with another schedule is refused with the ways forward; --extend allows exactly another
    train.max_steps, usually a longer one (its schedule: Engine.sync_learning_rate, docs/reliability.md). A shorter
    one gets the same treatment: the schedule rebuilt to end at the new length, as if it had been asked."""
    steps = "train.max_steps"
    if extend and changed == [steps] and new[steps] > 0:
        return []
    if extend and steps not in changed:
        return [f"--extend continues {resume} to another length: add {steps}=N (the run has {old[steps]})."]
    if extend and changed == [steps]:
        return [f"--extend needs the new length in steps, not {steps}=0 (train.epochs): give {steps}=N."]
    out = []
    for key in changed:
        extend_hint = (f"add --extend to continue to {steps}={new[steps]} on the schedule rebuilt for that "
                       f"length (as if it had been asked from the start; docs/reliability.md), " if key == steps else
                       "")
        out.append(f"{key}={new[key]!r} changes the learning-rate schedule that the steps already taken followed "
                   f"(the run used {old[key]!r}), so the resumed run would match neither this run nor one asked "
                   f"that way from the start. Resume without changing {key} (the schedule is kept), "
                   f"{extend_hint}or start a new run (another output.dir) with the schedule you want.")
    return out


def _extend_past_checkpoint(run_dir: Path, resume: str, new: dict[str, Any], extend: bool) -> list[str]:
    """--extend to a length the run has already reached would train nothing (or stop at once, past its end): the
    new train.max_steps must lie beyond the newest checkpoint's step."""
    from loraflow.checkpoints.store import complete_checkpoints

    steps = new.get("train.max_steps", 0)
    found = complete_checkpoints(run_dir) if extend and steps > 0 else []
    taken = int(found[-1].name.removeprefix("step-")) if found else 0
    if steps > taken:
        return []
    return [f"--extend to train.max_steps={steps}: {resume} already has a checkpoint at step {taken}, so nothing "
            f"would be trained. Give a length beyond it (train.max_steps={taken + 1} or more), or resume without "
            "--extend."]


def _has_checkpoint(run_dir: Path) -> bool:
    """Any checkpoint that looks complete; which one verifies is decided when resuming (it may fall back)."""
    from loraflow.checkpoints.store import complete_checkpoints

    return bool(complete_checkpoints(run_dir))


def refuse_used_directory(run_dir: Path) -> None:
    """A new run writes into a new or empty directory: never appends to someone's metrics or overwrites files."""
    if not run_dir.is_dir():
        if run_dir.exists():
            raise ConfigError([f"output.dir={run_dir} is a file; choose a directory path for output.dir."])
        return
    held = sorted(p.name for p in run_dir.iterdir())
    if set(held) <= {"train.log", "plan.json", ATTEMPTS}:
        return  # empty, or an attempt that failed before it started (set aside by `train`): a corrected retry
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    if (run_dir / "config.yaml").exists():
        how = (f"Continue it with --resume {run_dir}" if _has_checkpoint(run_dir) else
               f"It never wrote a checkpoint: start it again in place with --restart {run_dir}")
        raise ConfigError([f"output.dir={run_dir} already holds a run ({shown}). {how}, or choose another "
                           "output.dir."])
    raise ConfigError([f"output.dir={run_dir} already holds files ({shown}). A new run writes into a new or empty "
                       "directory, so that nothing there is overwritten or appended to: choose another output.dir."])


def _restart_config(run_dir: Path, config_path: str | None, overrides: list[str]) -> Config:
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError([f"--restart {run_dir}: no config.yaml there; is it a loraflow run directory? (A new run "
                           "takes output.dir instead.)"])
    if config_path is not None:
        raise ConfigError([f"--restart reuses {saved}; pass only key=value overrides, not {config_path}."])
    if _has_checkpoint(run_dir):
        raise ConfigError([f"--restart {run_dir}: the run there has a checkpoint; continue it with --resume "
                           f"{run_dir} (a restart would set aside its training), or start a new run elsewhere."])
    moved = [o for o in overrides if o.split("=", 1)[0].strip() == "output.dir"]
    if moved:
        raise ConfigError([f"--restart {run_dir} restarts the run in that directory; remove {moved[0]} (or start a "
                           "new run there with output.dir instead of --restart)."])
    return load_config(saved, overrides)


def needs_setting_aside(run_dir: Path, resume: bool, restart: bool) -> bool:
    """Whether an earlier attempt's files are in the way: a restart's, or those of an attempt that failed before
    it started (train.log, plan.json). A resumed run continues its files instead."""
    return not resume and (restart or any((run_dir / n).exists() for n in ("train.log", "plan.json")))


def set_aside_attempt(run_dir: Path) -> Path:
    """Move the earlier attempt's files into earlier-attempts/N/ (kept, not deleted: its log says why it
    stopped)."""
    root = run_dir / ATTEMPTS
    n = 1 + max((int(p.name) for p in root.glob("*") if p.name.isdigit()), default=0)
    target = root / str(n)
    target.mkdir(parents=True)
    for name in RUN_FILES:
        if (run_dir / name).exists():
            (run_dir / name).rename(target / name)
    return target
