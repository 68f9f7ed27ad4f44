"""One training run from config to saved adapter, shared by every stage: run directory, logging, plan, data,
model, then the stage's loop."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from loraflow.checkpoint import write_atomic_text
from loraflow.config import Config, config_to_dict, dump_config, load_config
from loraflow.errors import ConfigError

log = logging.getLogger("loraflow")


class _TqdmHandler(logging.StreamHandler):
    """Console log lines that do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)


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
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(fh)
    import transformers

    transformers.logging.set_verbosity_error()  # their per-call warnings would drown the plan
    transformers.utils.logging.disable_progress_bar()


def demo_config(stage: str) -> Path:
    from loraflow.setup.model import ASSETS

    return ASSETS / "configs" / f"{stage}.yaml"


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
                stamp: str | None = None, create: bool = True) -> tuple[Config, Path]:
    """Load the config and settle the run directory. A resumed run reuses the config saved in its directory; only
    train.max_steps, eval.* and output.* may be overridden. A new run never reuses a directory that holds one.
    Only the directory is created here (by one process: `create`); config.yaml is saved once the run has really
    started (see `train`). `stamp` names a new run's default directory; every rank of a run gets rank 0's."""
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
    else:
        if config_path is None:
            config_path = str(demo_config(stage))  # the embedded default: bundled model, data and settings
        config = load_config(config_path, [f"stage={stage}", *overrides])
        run_dir = Path(config.output.dir or f"runs/{stage}-{stamp or time.strftime('%Y%m%d-%H%M%S')}")
        if (run_dir / "config.yaml").exists():
            raise ConfigError([f"output.dir={run_dir} already holds a run. Continue it with --resume {run_dir}, or "
                               "choose another output.dir."])
        if create:
            run_dir.mkdir(parents=True, exist_ok=True)
    if config.stage != stage:
        raise ConfigError([f"the config says stage={config.stage}, but the command trains {stage}."])
    config.output.dir = str(run_dir)
    return config, run_dir


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def train(stage: str, config_path: str | None, overrides: list[str], resume: str | None,
          verbose: bool = False) -> dict[str, Any]:
    from loraflow.environment import detect_environment
    from loraflow.plan import resolve
    from loraflow.setup import build_model
    from loraflow.setup.model import load_tokenizer

    main, stamp = _start_processes(stage, config_path, overrides, resume)
    config, run_dir = prepare_run(stage, config_path, overrides, resume, stamp, create=main)
    _sync()
    setup_logging(run_dir, verbose, main)
    log.info("run directory: %s", run_dir)
    if config_path is None and resume is None:
        log.info("no config given: training the built-in demo (%s)", demo_config(stage))
    plan = resolve(config, detect_environment())
    log.info("%s", plan.render())
    if main:
        (run_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2))
    plan.raise_for_errors()
    seed_everything(config.train.seed)  # adapter initialisation, data order and dropout all follow train.seed
    tokenizer = load_tokenizer(config, plan.model.path)
    # Data before the model: a malformed line should fail in seconds, not after loading weights.
    stage_module = importlib.import_module(f"loraflow.stages.{stage}")
    train_split, eval_split = stage_module.load_data(config, tokenizer)
    log.info("%s", train_split.stats.describe("train data", config.data.max_length))
    if eval_split is not None:
        log.info("%s", eval_split.stats.describe("eval data", config.data.max_length))
    model = build_model(plan, tokenizer)
    # Only now is this a run: a failure above leaves the directory free for a corrected retry.
    if main:
        write_atomic_text(run_dir / "config.yaml", dump_config(config))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("trainable parameters: %s of %s", f"{trainable:,}", f"{sum(p.numel() for p in model.parameters()):,}")
    summary = stage_module.run(plan, model, tokenizer, train_split, eval_split, run_dir, resume is not None)
    summary["run_dir"] = str(run_dir)
    summary["main"] = main
    if main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _stop_processes()
    return summary


def _start_processes(stage: str, config_path: str | None, overrides: list[str],
                     resume: str | None) -> tuple[bool, str]:
    """Join the launcher's process group when there is one (or the config asks for a distributed engine), and
    agree on the run's time stamp. Returns (is rank 0, stamp)."""
    import os

    stamp = time.strftime("%Y%m%d-%H%M%S")
    config_for_launch = load_config(Path(resume) / "config.yaml") if resume and (Path(resume) / "config.yaml").is_file() \
        else load_config(config_path or str(demo_config(stage)), [f"stage={stage}", *overrides])
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 and config_for_launch.parallel.engine in ("auto", "single"):
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
