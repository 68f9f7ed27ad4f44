"""Optional packages (plan/packages.py): a setup whose package is missing is refused by the plan, in `check` and
`train` alike, with the install line pyproject.toml declares, before anything is loaded or written.

A package is made missing by fault injection: a sitecustomize on PYTHONPATH sets sys.modules[name] = None, so the
subprocess cannot import it (nothing of the package itself is replaced)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import loraflow
from loraflow.config import load_config
from loraflow.enginespec import ENGINES
from loraflow.environment import Environment, optional_extras, with_versions
from loraflow.errors import ConfigError
from loraflow.plan.packages import needed_packages, require_packages

SRC = Path(loraflow.__file__).resolve().parents[1]
PYPROJECT = SRC.parent / "pyproject.toml"
BLOCKER = ("import os, sys\n"
           "for name in filter(None, os.environ.get('LORAFLOW_TEST_BLOCK', '').split(',')):\n"
           "    sys.modules[name] = None  # `import name` now raises ImportError, as where it is not installed\n")


def run_without(tmp_path: Path, blocked: str, *argv: str) -> subprocess.CompletedProcess:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{SRC}", "LORAFLOW_TEST_BLOCK": blocked,
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "loraflow", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


CASES = {
    "deepspeed": (["parallel.engine=deepspeed", "parallel.zero_stage=3"], "pip install 'loraflow[deepspeed]'",
                  "parallel.engine=deepspeed"),
    "bitsandbytes": (["model.quantization.method=nf4"], "pip install 'loraflow[qlora]'",
                     "model.quantization.method=nf4"),
}


@pytest.mark.parametrize("package", sorted(CASES))
def test_check_refuses_a_setup_whose_package_is_missing_with_exit_2(tmp_path, package):
    overrides, install, key = CASES[package]
    proc = run_without(tmp_path, package, "check", *overrides)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"needs {package}, which is not installed here: {install}" in proc.stderr
    assert key in proc.stderr and "bug" not in proc.stderr


@pytest.mark.parametrize("package", sorted(CASES))
def test_train_refuses_it_before_loading_anything(tmp_path, package):
    overrides, install, key = CASES[package]
    run_dir = tmp_path / "run"
    proc = run_without(tmp_path, package, "train", "sft", *overrides, f"output.dir={run_dir}")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"needs {package}, which is not installed here: {install}" in proc.stderr
    assert key in proc.stderr and "bug" not in proc.stderr and "Traceback" not in proc.stderr
    # Only the log of the refused attempt (which a corrected retry in the same directory sets aside): no plan, no
    # config, no checkpoint; and neither the data nor the model was read.
    assert sorted(p.name for p in run_dir.iterdir()) == ["train.log"]
    log = (run_dir / "train.log").read_text()
    assert "which is not installed here" in log
    assert "train data:" not in log and "trainable parameters" not in log


def test_every_declared_need_has_an_extra_in_pyproject():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    declared = {p for e in ENGINES.values() for p in e.needs} | {"bitsandbytes", "vllm", "matplotlib", "datasets"}
    found = optional_extras()
    for package in declared:
        assert package in found, package
        assert any(r.startswith(package) for r in extras[found[package]]), (package, found[package])


def test_needs_follow_the_setup(tmp_path):
    plain = load_config(None, [])
    assert needed_packages(plain, "single") == []
    grpo = load_config(None, ["stage=grpo", "rl.rewards=[builtin:reverse_partial]", "rl.rollout.engine=vllm"])
    assert [p for p, _, _ in needed_packages(grpo, "single")] == ["vllm"]
    remote = load_config(None, ["stage=grpo", "rl.rewards=[builtin:reverse_partial]", "rl.rollout.engine=vllm",
                                "rl.rollout.urls=[http://h:8000]"])
    assert needed_packages(remote, "single") == []  # servers elsewhere: nothing to start here
    sft_vllm = load_config(None, ["rl.rollout.engine=vllm"])
    assert needed_packages(sft_vllm, "single") == []  # SFT never samples


def test_all_missing_packages_are_refused_at_once_and_versions_given_count_as_installed():
    config = load_config(None, ["parallel.engine=deepspeed", "model.quantization.method=int8"])
    env = Environment(missing=frozenset({"deepspeed", "bitsandbytes"}))
    with pytest.raises(ConfigError) as caught:
        require_packages(config, env, "deepspeed")
    assert len(caught.value.problems) == 2
    # `check --versions deepspeed=0.19.8` describes the machine the run goes to: it has deepspeed.
    from packaging.version import Version

    given = with_versions(env, {"deepspeed": Version("0.19.8")})
    with pytest.raises(ConfigError) as caught:
        require_packages(config, given, "deepspeed")
    assert [p.split(" needs ")[1].split(",")[0] for p in caught.value.problems] == ["bitsandbytes"]
    require_packages(config, Environment(), "deepspeed")  # a hand-made environment lacks nothing
