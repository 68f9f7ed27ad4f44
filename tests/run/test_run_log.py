"""Other packages' import-time notices stay off the console (run/log.py): peft imports bitsandbytes whenever it is
installed, and bitsandbytes 0.50 then warns about its optional CPU kernels on every command, quantized or not. A
run keeps such lines in its train.log; commands without a run drop them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import loraflow

SRC = Path(loraflow.__file__).resolve().parents[1]


def loraflow_cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "loraflow", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def bitsandbytes_warns_here() -> bool:
    """Whether importing bitsandbytes logs its kernels notice on this machine (a CPU with AVX512-BF16 and no
    `kernels` package): where it does not, the tests below still pass, and prove less."""
    if importlib.util.find_spec("bitsandbytes") is None or importlib.util.find_spec("kernels") is not None:
        return False
    from bitsandbytes.functional import has_avx512bf16

    return bool(has_avx512bf16())


def test_help_and_check_of_an_unquantized_config_print_nothing_of_bitsandbytes(tmp_path):
    helped = loraflow_cli(tmp_path, "--help")
    assert helped.returncode == 0 and "bitsandbytes" not in helped.stderr + helped.stdout
    checked = loraflow_cli(tmp_path, "check")  # the demo: LoRA on an unquantized base
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "bitsandbytes" not in checked.stderr and "gemm_4bit" not in checked.stderr + checked.stdout


def test_a_run_keeps_other_packages_notices_in_its_log_not_on_the_console(tmp_path):
    run = tmp_path / "run"
    proc = loraflow_cli(tmp_path, "train", "sft", "train.max_steps=1", "data.eval=", "output.progress_bar=false",
                        "output.tensorboard=false", f"output.dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bitsandbytes" not in proc.stderr and "gemm_4bit" not in proc.stderr + proc.stdout
    if bitsandbytes_warns_here():
        assert "[bitsandbytes.backends.cpu.ops] Failed to load CPU gemm_4bit_forward" in (run / "train.log").read_text()
