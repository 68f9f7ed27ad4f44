"""The optional packages a setup needs, checked by the plan before any model is inspected or loaded.

Which setup needs which package is declared beside the setup itself: an engine's `needs` in the engine table
(enginespec.py), the quantization's in config/quantization.py, a local vLLM rollout engine's in config/rollout.py.
Which extra installs a package is pyproject.toml's [project.optional-dependencies] (environment.optional_extras).
What this process can import is the environment's `missing` (environment.detect_environment). This module only
joins the three, so `check` and `train` refuse the same setups with the same words, and `train` never gets as far
as a ModuleNotFoundError deep inside an engine.
"""

from __future__ import annotations

from loraflow.config.schema import Config
from loraflow.enginespec import ENGINES, choosing_keys, engine_spec
from loraflow.environment import Environment, install_line
from loraflow.errors import ConfigError
from loraflow.stagespec import stage_spec


def needed_packages(config: Config, engine: str) -> list[tuple[str, str, str]]:
    """(package, the setting that needs it, the other way out) for every optional package the setup imports."""
    out = []
    spec = engine_spec(engine)
    if spec.needs:
        asked = (f"parallel.engine=auto with {', '.join(choosing_keys(spec, config.parallel))} ({spec.description})"
                 if config.parallel.engine == "auto" else f"parallel.engine={engine} ({spec.description})")
        others = [e.name for e in ENGINES.values() if e.runs and not e.needs and e.distributed]
        out += [(p, asked, f"set parallel.engine to {' or '.join(others)} (or single for one process)")
                for p in spec.needs]
    q = config.model.quantization
    out += [(p, f"model.quantization.method={q.method}", "set model.quantization.method=none") for p in q.needs]
    ro = config.rl.rollout
    out += [(p, "rl.rollout.engine=vllm with no rl.rollout.urls (a local engine)",
             "on a CPU machine build vLLM's own venv with `bash scripts/setup_vllm.sh` (or set LORAFLOW_VLLM_PYTHON), "
             "or point rl.rollout.urls at running `vllm serve` servers, or set rl.rollout.engine=hf")
            for p in ro.needs(stage_spec(config.stage).generates)]
    return out


def require_packages(config: Config, env: Environment, engine: str) -> None:
    """Refuse, all at once, every needed optional package this environment lacks: what needs it, the install line
    pyproject.toml declares, and the setting that avoids it. Nothing has been loaded or written yet."""
    problems = [f"{asked} needs {package}, which is not installed here: {install_line(package)}, or {way_out}."
                for package, asked, way_out in needed_packages(config, engine) if package in env.missing]
    if problems:
        raise ConfigError(problems)
