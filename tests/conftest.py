"""Shared fixtures: a tiny Llama built from a config (4 layers, 64 wide) with the shipped character tokenizer,
small chat datasets, and helpers to build a plan and a model exactly as `loraflow train` does."""

from __future__ import annotations

import json
import os
import random
import shutil
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
from loraflow.setup.model import ASSETS, load_tokenizer  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


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
