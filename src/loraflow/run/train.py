"""One training run from config to saved adapter, shared by every stage: the short orchestration of `train`.
Each job it orchestrates lives in its own module of this room: which config a run starts from (config.py), the run
directory's lifecycle (directory.py), the process group (process_group.py), logging (log.py) and how a failed run
says so (failures.py); the run itself is built by pipeline.build_run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from loraflow.config import Config
from loraflow.run.config import demo_config, starting_config
from loraflow.run.directory import needs_setting_aside, prepare_run, set_aside_attempt
from loraflow.run.failures import failures_logged
from loraflow.run.log import setup_logging
from loraflow.run.process_group import join_process_group, leave_process_group, wait_for_every_rank

log = logging.getLogger("loraflow")


def train(stage: str, config_path: str | None, overrides: list[str], resume: str | None,
          verbose: bool = False, restart: str | None = None, extend: bool = False) -> dict[str, Any]:
    main, stamp = join_process_group(stage, config_path, overrides, resume or restart)
    extended_from = _saved_max_steps(resume) if extend else None
    config, run_dir = prepare_run(stage, config_path, overrides, resume, stamp, restart=restart, extend=extend)
    wait_for_every_rank()  # every rank has read the directory before any rank writes to it
    from loraflow.checkpoints.storage import check_writable

    # Before any data or model is loaded: a read-only or full disk fails in a second. Every rank probes (and gets
    # the same error on a shared file system), so none is left waiting for a rank that stopped.
    check_writable(run_dir)
    if main and needs_setting_aside(run_dir, bool(resume), bool(restart)):
        set_aside_attempt(run_dir)  # a restart, or an attempt that failed before it started: keep its log
    wait_for_every_rank()
    setup_logging(run_dir, verbose, main)
    with failures_logged(run_dir):
        return _train(stage, config, run_dir, main, config_path is None and not resume and not restart and
                      starting_config(stage, None, overrides) is not None, resume is not None, extended_from)


def _saved_max_steps(resume: str | None) -> int | None:
    """train.max_steps of the run --extend continues (None where there is no saved config: prepare_run says so)."""
    from loraflow.config import load_config

    saved = Path(resume or "") / "config.yaml"
    return load_config(saved).train.max_steps if resume and saved.is_file() else None


def _train(stage: str, config: Config, run_dir: Path, main: bool, demo: bool, resume: bool,
           extended_from: int | None = None) -> dict[str, Any]:
    from loraflow.environment import detect_environment
    from loraflow.run.pipeline import build_run

    log.info("run directory: %s", run_dir)
    if extended_from is not None:
        log.info("--extend: train.max_steps %d -> %d; the learning-rate schedule is rebuilt for %d steps, as if they "
                 "had been asked from the start: the steps after the checkpoint take that schedule's rates (the "
                 "steps already taken followed the %d-step schedule)", extended_from, config.train.max_steps,
                 config.train.max_steps, extended_from)
    if demo:
        log.info("no config and no model given: training the built-in demo (%s)", demo_config(stage))
    summary = build_run(config, detect_environment(), run_dir, resume, record=main).fit()
    summary["run_dir"] = str(run_dir)
    summary["main"] = main
    if main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    leave_process_group()
    return summary
