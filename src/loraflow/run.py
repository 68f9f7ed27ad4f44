"""One training run from config to saved adapter, shared by every stage: run directory, logging, plan, data,
model, then the stage's loop."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from loraflow.config import Config, config_to_dict, load_config
from loraflow.enginespec import wants_process_group
from loraflow.errors import ConfigError
from loraflow.pipeline import seed_everything

__all__ = ["demo_config", "load_run_config", "prepare_run", "seed_everything", "starting_config", "train"]

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
        import os

        console.setFormatter(logging.Formatter(f"[rank {os.environ.get('RANK', '?')}] %(message)s"))
        log.addHandler(console)
        run_dir = None
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


def demo_config(stage: str) -> Path:
    from loraflow.setup.model import ASSETS

    return ASSETS / "configs" / f"{stage}.yaml"


def starting_config(stage: str, config_path: str | None, overrides: list[str]) -> str | None:
    """The file a new run's config is read from: the user's, or the stage's built-in demo when the user gives
    neither a config nor a model. A user's own model starts from the neutral defaults, so nothing of the demo (its
    data, its eval set, the adapters RL demos merge into the tiny base) leaks into a run on other weights."""
    if config_path is not None:
        return config_path
    if any(o.split("=", 1)[0].strip() == "model.path" for o in overrides):
        return None
    return str(demo_config(stage))


def load_run_config(stage: str, config_path: str | None, overrides: list[str]) -> Config:
    """A new run's config as `train` and `check` read it (see `starting_config`)."""
    return load_config(starting_config(stage, config_path, overrides), [f"stage={stage}", *overrides])


# Keys a resumed run may change: everything else shapes the adapter, the optimizer state or the data order,
# which were saved with the checkpoint (the optimizer state even restores its own learning rate).
RESUMABLE = ("train.max_steps", "eval.", "output.")


def _flat(config: Config) -> dict[str, Any]:
    def walk(node: Any, prefix: str) -> dict[str, Any]:
        if isinstance(node, dict):
            return {k: v for key, sub in node.items() for k, v in walk(sub, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}

    return walk(config_to_dict(config), "")


def prepare_run(stage: str, config_path: str | None, overrides: list[str], resume: str | None,
                stamp: str | None = None, restart: str | None = None) -> tuple[Config, Path]:
    """Load the config and settle the run directory. A resumed run reuses the config saved in its directory; only
    train.max_steps, eval.* and output.* may be overridden. A restarted run (one that never wrote a checkpoint)
    reuses its saved config with any overrides, and its earlier attempt's files are kept aside. A new run never
    reuses a directory that holds one, or that holds anything at all. Nothing is written here (every rank reads the
    directory before any rank changes it: see `train`); config.yaml is saved once the run has really started.
    `stamp` names a new run's default directory; every rank of a run gets rank 0's."""
    if resume:
        run_dir = Path(resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError([f"--resume {resume}: no config.yaml there; is it a loraflow run directory?"])
        if config_path is not None:
            raise ConfigError([f"--resume reuses {saved}; pass only key=value overrides, not {config_path}."])
        before, config = load_config(saved), load_config(saved, overrides)
        old, new = _flat(before), _flat(config)
        changed = [k for k in new if new[k] != old.get(k)]
        frozen = [k for k in changed if k == "output.dir" or not k.startswith(RESUMABLE)]
        if frozen:
            raise ConfigError([f"{k}={new[k]!r} cannot change when resuming (the run used {old.get(k)!r}): the "
                               "checkpoint's adapter, optimizer state and data order depend on it. Start a new run "
                               "instead." for k in frozen])
        if not _has_checkpoint(run_dir):
            raise ConfigError([f"--resume {resume}: the run there stopped before it wrote any checkpoint, so there "
                               f"is nothing to continue. Start it again in place with `loraflow train {stage} "
                               f"--restart {resume}` (its earlier files are kept aside), and set "
                               "output.save_every_steps so a long run leaves checkpoints."])
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
        from loraflow.metrics import check_wandb

        check_wandb(config.output.wandb)
    config.output.dir = str(run_dir)
    return config, run_dir


def _has_checkpoint(run_dir: Path) -> bool:
    """Any checkpoint that looks complete; which one verifies is decided when resuming (it may fall back)."""
    from loraflow.checkpoint import complete_checkpoints

    return bool(complete_checkpoints(run_dir))


# What a run writes into its directory; everything else there is the user's and is never moved or written to.
RUN_FILES = ("config.yaml", "plan.json", "train.log", "metrics.jsonl", "summary.json", "latest", "tensorboard",
             "checkpoints", "adapter", "model", "plots")
ATTEMPTS = "earlier-attempts"


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


def train(stage: str, config_path: str | None, overrides: list[str], resume: str | None,
          verbose: bool = False, restart: str | None = None) -> dict[str, Any]:
    main, stamp = _start_processes(stage, config_path, overrides, resume or restart)
    config, run_dir = prepare_run(stage, config_path, overrides, resume, stamp, restart=restart)
    _sync()  # every rank has read the directory before any rank writes to it
    from loraflow.storage import check_writable

    # Before any data or model is loaded: a read-only or full disk fails in a second. Every rank probes (and gets
    # the same error on a shared file system), so none is left waiting for a rank that stopped.
    check_writable(run_dir)
    if main and not resume and (restart or any((run_dir / n).exists() for n in ("train.log", "plan.json"))):
        set_aside_attempt(run_dir)  # a restart, or an attempt that failed before it started: keep its log
    _sync()
    setup_logging(run_dir, verbose, main)
    try:
        return _train(stage, config, run_dir, main, config_path is None and not resume and not restart and
                      starting_config(stage, None, overrides) is not None, resume is not None)
    except Exception as exc:
        from loraflow.storage import write_failure

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


def _train(stage: str, config: Config, run_dir: Path, main: bool, demo: bool, resume: bool) -> dict[str, Any]:
    from loraflow.environment import detect_environment
    from loraflow.pipeline import build_run

    log.info("run directory: %s", run_dir)
    if demo:
        log.info("no config and no model given: training the built-in demo (%s)", demo_config(stage))
    summary = build_run(config, detect_environment(), run_dir, resume, record=main).fit()
    summary["run_dir"] = str(run_dir)
    summary["main"] = main
    if main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _stop_processes()
    return summary


def _start_processes(stage: str, config_path: str | None, overrides: list[str],
                     resume: str | None) -> tuple[bool, str]:
    """Join the launcher's process group when there is one (or the config asks for a distributed engine), and
    agree on the run's time stamp. Returns (is rank 0, stamp). `resume` is the run directory of --resume or
    --restart: its saved config decides the engine."""
    import os

    stamp = time.strftime("%Y%m%d-%H%M%S")
    saved = Path(resume) / "config.yaml" if resume else None
    # A resumed run keeps its engine (only train/eval/output keys may change); a restarted one may change it.
    config_for_launch = load_config(saved, overrides) if saved is not None and saved.is_file() \
        else load_run_config(stage, config_path, overrides)
    if not wants_process_group(config_for_launch.parallel.engine, int(os.environ.get("WORLD_SIZE", "1"))):
        return True, stamp
    import torch.distributed as dist

    from loraflow.engines import init_distributed

    init_distributed(config_for_launch.parallel.backend)
    box = [stamp]
    dist.broadcast_object_list(box, src=0)
    return dist.get_rank() == 0, box[0]


def _sync() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _stop_processes() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
