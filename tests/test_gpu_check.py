"""scripts/gpu_check.sh never rots: its CPU rehearsal (`--device cpu --quick`) runs every step on this machine, once
on the tested stack (.venv) and once on the oldest transformers and peft pyproject.toml declares (.venv-floor, built
by scripts/setup_floor_venv.sh before pytest), and must pass on both. The bundle for the GPU machine
(scripts/gpu_bundle.py) and the version floors are checked piece by piece."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, run_gpu_check
from packaging.version import Version

from loraflow.environment import declared_floors, too_old
from loraflow.verify import device_grads
from loraflow.verify.side_envs import side_python

STEPS = ("env", "grads", "demo", "qlora", "vision", "rollout", "head", "peers")
SETUP_FLOOR = "bash scripts/setup_floor_venv.sh"


@pytest.fixture(scope="module")
def tested_stack(gpu_check_quick):
    return gpu_check_quick


@pytest.fixture(scope="module")
def floor_stack(tmp_path_factory):
    python = side_python("floor")
    if not python.is_file():  # built before pytest (scripts/test.sh), never inside a test's timeout
        pytest.fail(f"the floor environment is missing ({python}): build it with `{SETUP_FLOOR}`")
    return run_gpu_check(tmp_path_factory.mktemp("gpu-check-floor"), str(python), FLOOR_STEPS)


FLOOR_STEPS = tuple(s for s in STEPS if s not in ("peers", "rollout"))
"""The floor stack's rehearsal: every step but the peers benchmark, whose code (the plain loop, TRL) is not
loraflow's and whose timing the tested stack's run covers (25 s saved from CI), and the vLLM rollout, whose engine
runs from its own venv whatever the stack (tests/stages/test_vllm_rollouts.py covers the trainer's side)."""


def _assert_every_step_passed(proc, summary, steps_run=STEPS) -> None:
    steps = summary["steps"]
    assert list(steps) == list(steps_run)
    failed = {name: r["headline"] for name, r in steps.items() if r["status"] != "pass"}
    assert not failed and proc.returncode == 0, f"{failed}\n{proc.stdout[-4000:]}"


def test_the_cpu_rehearsal_passes_every_step_and_writes_its_summary(tested_stack):
    proc, summary = tested_stack
    _assert_every_step_passed(proc, summary)
    assert summary["device"] == "cpu" and summary["quick"] is True
    printed = proc.stdout[proc.stdout.index("# loraflow device check"):]  # the summary comes last
    assert printed.rstrip() == (Path(summary["out"]) / "summary.md").read_text().rstrip()
    assert printed.startswith(f"# loraflow device check: {len(STEPS)}/{len(STEPS)} steps pass")
    env = summary["steps"]["env"]["figures"]
    assert env["bfloat16_matmul_tflops"] > 0 and env["float32_matmul_tflops"] > 0
    assert "/loraflow-gpu-check-site." in env["loraflow_path"], "the steps must run the copy gpu_check.sh installed"
    assert env["too_old"] == []


def test_every_gradient_cell_ran_and_matched_its_reference(tested_stack):
    _, summary = tested_stack
    rows = summary["steps"]["grads"]["rows"]
    assert [r["cell"] for r in rows] == [c.id for c in device_grads.cells()]
    for row in rows:
        assert row["verdict"] == "pass" and row["saved_tensors"] > 0, row
        precision = row["cell"].split("/")[2]
        if precision == "fp32":
            assert row["grad_error"] <= device_grads.FP32_TOLERANCE
        else:  # bf16 rounding is really there (not an fp32 run under another name) and within its bound
            bound = device_grads.BF16_TOLERANCE_NF4 if row["cell"].endswith("/nf4") else device_grads.BF16_TOLERANCE
            assert 1e-3 < row["grad_error"] <= bound["grad"], row


def test_the_peers_step_compares_three_variants_from_one_start(tested_stack):
    _, summary = tested_stack
    figures = summary["steps"]["peers"]["figures"]
    assert figures, summary["steps"]["peers"]
    for cell in figures.values():
        losses = [cell[v]["first_loss"] for v in ("plain", "trl", "loraflow")]
        assert None not in losses and max(losses) - min(losses) <= 2e-3 * abs(losses[0])
        assert all(cell[v]["tokens_per_s"] > 0 for v in ("plain", "trl", "loraflow"))


def test_the_rollout_step_samples_on_a_local_vllm_engine(tested_stack):
    _, summary = tested_stack
    figures = summary["steps"]["rollout"]["figures"]
    assert figures["steps"] == 3 and figures["logprob_diff_max"] <= 1e-4 and figures["sync_bytes"] > 0


def test_without_vllm_the_rollout_step_says_it_could_not_and_fails_nothing(monkeypatch, tmp_path):
    from loraflow.verify import device_steps

    monkeypatch.setenv("LORAFLOW_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    record = device_steps.rollout({"work": tmp_path, "quick": True, "log": tmp_path / "log"})
    assert record["status"] == "unavailable" and "not run" in record["headline"]


def test_the_headline_judges_the_worst_cell_by_its_own_bound():
    """A 4-bit base's bf16 cell has a looser bound (0.3) than the others (0.15): the H200 run of 2026-11-27 printed
    "2.0e-01 (<= 0.15)" for a passing cell, which read as a failure."""
    rows = [{"cell": "lora/off/bf16-mixed/single", "verdict": "pass", "grad_error": 0.065, "limits": {"grad": 0.15}},
            {"cell": "lora/off/bf16-mixed/single/nf4", "verdict": "pass", "grad_error": 0.2, "limits": {"grad": 0.3}}]
    line = device_grads.headline(rows)
    assert "2/2 cells pass" in line and "2.0e-01 (<= 0.3, lora/off/bf16-mixed/single/nf4)" in line


def test_the_oldest_declared_transformers_and_peft_pass_the_rehearsal(floor_stack):
    proc, summary = floor_stack
    env = summary["steps"]["env"]["figures"]["loraflow_version"]
    floors = declared_floors()
    for package in ("transformers", "peft"):  # the floor environment really has the floors
        assert f"{package} {floors[package]}" in env, env
    _assert_every_step_passed(proc, summary, FLOOR_STEPS)


# -- the pieces ------------------------------------------------------------------------------------------------------
def _bundle_module():
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "scripts" / "gpu_bundle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bitsandbytes_keeps_only_the_kernels_asked_for_and_its_record_matches(tmp_path):
    bundle = _bundle_module()
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    names = ["bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/libbitsandbytes_cuda130.so",
             "bitsandbytes/libbitsandbytes_cuda126.so", "bitsandbytes/libbitsandbytes_rocm72.so",
             "bitsandbytes/libbitsandbytes_xpu2025.so"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in names:
            z.writestr(name, b"x" * 100)
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", "".join(f"{n},sha256=abc,100\n" for n in names))
    dropped = bundle.slim_bitsandbytes(wheel, {"130"})
    assert sorted(dropped) == sorted(names[3:])
    with zipfile.ZipFile(wheel) as z:
        kept = [n for n in z.namelist() if not n.endswith("RECORD")]
        record = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    assert kept == names[:3]
    assert [line.split(",")[0] for line in record.splitlines()] == names[:3]
    assert oct(wheel.stat().st_mode & 0o777) == "0o644"


def test_a_carried_wheel_is_installed_only_where_the_machine_lacks_it():
    bundle = _bundle_module()
    floors = {"peft": Version("0.20.0")}
    assert bundle.needed("deepspeed", "0.19.8", None, floors) == "missing"
    assert bundle.needed("typing-extensions", "4.16.0", "4.12.2", floors) == "4.12.2 < 4.16.0"
    assert bundle.needed("typing-extensions", "4.16.0", "4.17.0", floors) is None
    # a dependency loraflow declares: the machine's own release is kept down to loraflow's floor
    assert bundle.needed("peft", "0.21.2", "0.20.1", floors) is None
    assert bundle.needed("peft", "0.21.2", "0.19.1", floors) == "0.19.1 < 0.20.0"
    assert bundle.needed("torch", "2.13.0", "2.11.0+cu130", floors) == "2.11.0 < 2.13.0"


BUNDLE_MIB = 14.2
"""What scripts/gpu_wheels.sh put in .whl/ on 2026-11-26 (docs/measurements.md)."""


def test_the_travel_size_counts_the_tree_git_would_copy_and_leaves_room_for_the_bundle(tmp_path):
    bundle = _bundle_module()
    (tmp_path / "a.whl").write_bytes(b"x" * 1000)
    tree, files, whl = bundle.travel_size(tmp_path)
    assert whl == 1000 and files > 100 and tree > 5 * 2**20
    # A working tree grown past this would push the device check's transfer over the 60 MiB it must stay under.
    assert tree / 2**20 + BUNDLE_MIB < 60, f"the working tree is {tree / 2**20:.1f} MiB"


def test_an_older_dependency_than_declared_is_refused_before_anything_runs(monkeypatch, capsys):
    floors = declared_floors()
    assert floors["transformers"] >= Version("5.6.0") and floors["peft"] >= Version("0.20.0")
    older = {"transformers": Version("4.57.1"), "peft": floors["peft"]}
    problems = too_old(older)
    assert problems == [f"transformers 4.57.1 is installed; loraflow needs transformers>={floors['transformers']} "
                        f"(pip install 'transformers>={floors['transformers']}')"]
    import loraflow.environment as environment
    from loraflow.commands import cli

    monkeypatch.setattr(environment, "installed_version", lambda p: older.get(p, Version("99")))
    assert cli.main(["train", "sft", "train.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert "transformers 4.57.1 is installed" in err and "LORAFLOW_SKIP_VERSION_CHECK" in err
    assert cli.main(["explain", "--list"]) == 0  # reading logs needs no particular stack


def test_usage_errors_name_the_flag():
    proc = subprocess.run([sys.executable, "-m", "loraflow.verify.devicecheck", "--out", "/tmp/x", "--device",
                           "cpu", "--only", "grad"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--only: unknown step(s) grad" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "loraflow.verify.devicecheck", "--out", "/tmp/x", "--device",
                           "cuda"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2 and "--device cpu" in proc.stderr
