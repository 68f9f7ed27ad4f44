"""Trying and seeing a model: `loraflow generate` and `chat` give what PEFT gives for the saved adapter (token for
token), `loraflow plot` draws a run's curves, `--version` names the stack, and metrics.jsonl survives a torn line
and a resumed run's replay. Two short real runs on the bundled tiny model are trained once for the module: a plain
SFT run, and one that starts from a base with another adapter merged in (as the RL demos do)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from loraflow.commands.cli import main
from loraflow.errors import ConfigError, DataError
from loraflow.loop.metrics import MetricsWriter, read_metrics
from loraflow.run.train import train
from loraflow.locations import ASSETS

PROMPT = "Please write the word kelmu backwards."
QUIET = ["output.progress_bar=false", "output.tensorboard=false", "eval.generate=false", "eval.max_samples=20",
         "train.micro_batch_size=4"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    plain, merged = root / "sft-plain", root / "sft-merged"
    train("sft", None, [f"output.dir={plain}", "train.max_steps=20", "output.log_every_steps=5",
                        "eval.every_steps=10", *QUIET], None)
    train("sft", None, [f"output.dir={merged}", "train.max_steps=4", "output.log_every_steps=2",
                        "model.merge_adapters=[builtin:reverse-sft-weak]", *QUIET], None)
    return plain, merged


def reference_ids(adapter: Path, merge: list[str], prompt: str = PROMPT, max_new_tokens: int = 16) -> list[int]:
    """What PEFT alone gives: the base (with `merge` folded in), the adapter on top, model.generate, greedy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ASSETS / "tiny-base")
    for path in merge:
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-base")
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out = model.eval().generate(ids, max_new_tokens=max_new_tokens, do_sample=False)[0, ids.shape[1]:].tolist()
    return out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out


@pytest.fixture(scope="module")
def loaded_plain(runs):
    from loraflow.commands.generate import load

    return load(str(runs[0]))


def ours(target, prompt: str = PROMPT, **sampling) -> list[int]:
    """The tokens `loraflow generate` produces; `target` is a directory or an already loaded model."""
    from loraflow.commands.generate import Loaded, Prompt, Sampling, complete, load, prompt_ids

    loaded = target if isinstance(target, Loaded) else load(str(target))
    torch.manual_seed(sampling.get("seed", 0))
    return complete(loaded, prompt_ids(loaded, Prompt(None, prompt), True),
                    Sampling(max_new_tokens=16, **sampling)).token_ids


def rows(loaded, prompts: str | None = None) -> list[dict]:
    """`loraflow generate --json` on an already loaded model: PROMPT, or the prompts file `prompts`."""
    from loraflow.commands.generate import Prompt, Sampling, generate, read_prompts

    out = io.StringIO()
    generate(loaded, read_prompts(prompts) if prompts else [Prompt(None, PROMPT)], Sampling(max_new_tokens=16),
             as_json=True, out=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def generate_json(capsys, *argv: str) -> list[dict]:
    capsys.readouterr()
    assert main(["generate", *argv, "--max-new-tokens", "16", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# -- generate -----------------------------------------------------------------------------------------------------
def test_greedy_generation_equals_peft_token_for_token(runs, loaded_plain, capsys):
    plain, _ = runs
    expected = reference_ids(plain / "adapter", [])
    assert ours(loaded_plain) == expected
    assert expected != reference_ids(None, []), "the adapter should change the answer, or the test proves nothing"
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(ASSETS / "tiny-base").decode(expected, skip_special_tokens=True).strip()
    [row] = generate_json(capsys, str(plain), "--prompt", PROMPT)
    assert row == {"prompt": PROMPT, "completion": text, "tokens": len(expected)}


def test_adapter_directory_alone_gives_the_same(runs, tmp_path):
    plain, _ = runs
    alone = shutil.copytree(plain / "adapter", tmp_path / "adapter")  # no run config anywhere above it
    assert ours(alone) == reference_ids(plain / "adapter", [])


def test_run_with_merged_adapters_generates_from_the_merged_base(runs, capsys):
    _, merged = runs
    weak = ASSETS / "reverse-sft-weak"
    expected = reference_ids(merged / "adapter", [weak])
    assert ours(merged) == expected
    assert ours(merged / "adapter") == expected  # inside the run: its config supplies the merged adapter
    assert expected != reference_ids(merged / "adapter", []), "the merged adapter should matter here"


def test_sampling_with_a_seed_is_reproducible(runs, loaded_plain, capsys):
    plain, _ = runs
    args = [str(plain), "--prompt", PROMPT, "--temperature", "2.0", "--top-p", "0.95"]
    first = generate_json(capsys, *args, "--seed", "7")
    assert generate_json(capsys, *args, "--seed", "7") == first
    greedy = ours(loaded_plain)
    samples = [ours(loaded_plain, temperature=2.0, top_p=0.95, seed=s) for s in range(3)]
    assert any(s != greedy for s in samples), "temperature 2 never left the greedy path: not sampling"


def test_prompts_file_txt_and_jsonl(runs, loaded_plain, tmp_path, capsys):
    plain, _ = runs
    (tmp_path / "p.txt").write_text(f"{PROMPT}\n\nPlease write the word bebo backwards.\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": PROMPT}) + "\n" + json.dumps(
        {"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "umlek"}]}) + "\n")
    txt = rows(loaded_plain, str(tmp_path / "p.txt"))
    jsonl = rows(loaded_plain, str(tmp_path / "p.jsonl"))
    assert [r["prompt"] for r in txt] == [PROMPT, "Please write the word bebo backwards."]
    # An eval record's trailing assistant turn is its reference, not part of the prompt.
    assert jsonl[1]["messages"] == [{"role": "user", "content": PROMPT}] and jsonl[1]["reference"] == "umlek"
    assert txt[0]["completion"] == jsonl[0]["completion"] == jsonl[1]["completion"]
    capsys.readouterr()
    assert main(["generate", str(plain), "--prompt", PROMPT, "--max-new-tokens", "16"]) == 0
    assert capsys.readouterr().out == f">>> {PROMPT}\n{txt[0]['completion']}\n\n"


def test_bad_input_is_a_clear_error(runs, tmp_path, capsys):
    plain, _ = runs
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "neither").mkdir()
    from loraflow.config import dump_config, load_config
    from loraflow.run.config import demo_config

    (tmp_path / "rm-run").mkdir()
    (tmp_path / "rm-run/config.yaml").write_text(dump_config(load_config(demo_config("rm"))))
    cases = [([str(tmp_path / "missing"), "--prompt", "x"], "no such directory"),
             ([str(tmp_path / "neither"), "--prompt", "x"], "neither a run, an adapter nor a model"),
             ([str(plain), "--prompts", str(tmp_path / "empty.txt")], "holds no prompts"),
             ([str(plain), "--prompts", str(tmp_path / "bad.jsonl")], "bad.jsonl line 1: no `prompt`"),
             ([str(plain)], "exactly one of --prompt TEXT or --prompts FILE"),
             ([str(tmp_path / "rm-run"), "--prompt", "x"], "reward-model run (stage rm): it scores text"),
             ([str(plain), "--prompt", "x", "--base", str(tmp_path / "missing")], "--base="),
             ([str(plain), "--prompt", "x", "--top-p", "0"], "--top-p 0.0: must be in (0, 1]")]
    for argv, message in cases:
        capsys.readouterr()
        assert main(["generate", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_chat_keeps_the_conversation_and_resets(runs, loaded_plain, tmp_path, capsys, monkeypatch):
    from loraflow.commands.generate import Sampling, chat

    plain, _ = runs
    out = io.StringIO()
    conversation = f"{PROMPT}\n{PROMPT}\n/reset\n{PROMPT}\n/exit\n{PROMPT}\n"
    chat(loaded_plain, Sampling(max_new_tokens=16), io.StringIO(conversation), out)
    lines = out.getvalue().splitlines()
    assert lines[2] == "(conversation reset)" and len(lines) == 4  # nothing answered after /exit
    first, second, after_reset = (line.removeprefix("assistant> ") for line in (lines[0], lines[1], lines[3]))
    assert first == after_reset == rows(loaded_plain)[0]["completion"]
    # The second answer saw the first exchange: it equals generating from the whole conversation.
    (tmp_path / "conv.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": first},
        {"role": "user", "content": PROMPT}]}) + "\n")
    assert rows(loaded_plain, str(tmp_path / "conv.jsonl"))[0]["completion"] == second
    # The command reads stdin: end of input without /exit, and no trailing newline.
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    capsys.readouterr()
    assert main(["chat", str(plain), "--max-new-tokens", "16"]) == 0
    assert capsys.readouterr().out == f"assistant> {first}\n"


# -- plot ---------------------------------------------------------------------------------------------------------
def assert_pngs(paths: list[Path]) -> None:
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 1024, path


def test_plot_one_run_and_two_overlaid(runs, tmp_path, capsys):
    from loraflow.commands.plot import collect

    plain, merged = runs
    capsys.readouterr()
    assert main(["plot", str(plain)]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    assert {p.name for p in written} >= {"train-loss.png", "train-lr.png", "train-grad_norm.png", "eval-loss.png"}
    assert all(p.parent == plain / "plots" for p in written)
    assert_pngs(written)
    assert main(["plot", str(plain), str(merged)]) == 2
    assert "-o OUT_DIR" in capsys.readouterr().err
    assert main(["plot", str(plain), str(merged), "-o", str(tmp_path / "both")]) == 0
    both = [Path(p) for p in capsys.readouterr().out.split()]
    assert_pngs(both)
    assert set(collect([plain, merged])[("train", "loss")]) == {"sft-plain", "sft-merged"}  # the legend's names


def test_plot_draws_reward_curves_of_rl_runs(tmp_path, capsys):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step in range(1, 6):
        writer.write("train", step, {"loss": 1.0 / step, "grad_norm": 0.5, "lr": 1e-3, "reward": 0.1 * step,
                                     "kl": 0.01 * step, "tokens": 100 * step, "tokens_per_s": 9.0})
        writer.write("eval", step, {"reward": 0.2 * step, "reward/reverse_partial": 0.2 * step,
                                    "gold/reverse_exact": 0.1 * step, "exact_match": 0.1 * step})
    writer.write("memory", 1, {"peak_mib": 5.0})
    capsys.readouterr()
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    names = {Path(p).name for p in capsys.readouterr().out.split()}
    assert names == {"train-loss.png", "train-lr.png", "train-grad_norm.png", "train-reward.png", "train-kl.png",
                     "eval-reward.png", "eval-reward_reverse_partial.png", "eval-gold_reverse_exact.png",
                     "eval-exact_match.png"}


def test_plot_errors(tmp_path, capsys, monkeypatch):
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    MetricsWriter(tmp_path, tensorboard=False).write("train", 1, {"loss": 1.0})
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: importing it raises ImportError
    assert main(["plot", str(tmp_path)]) == 2
    assert "pip install 'loraflow[plot]'" in capsys.readouterr().err


# -- version, metrics, wandb --------------------------------------------------------------------------------------
def test_version_names_the_stack(capsys):
    from loraflow import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"loraflow {__version__}"
    for package in ("torch", "transformers", "peft", "deepspeed"):
        assert f"{package} {importlib.metadata.version(package)}" in out


def test_truncate_after_drops_later_rows_and_a_torn_line(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = MetricsWriter(tmp_path, tensorboard=True)
    for step in range(1, 7):
        writer.write("train", step, {"loss": float(step)})
        if step % 2 == 0:
            writer.write("eval", step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "step": 7, "lo')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path, "train")] == [1, 2, 3, 4, 5, 6]
    writer.truncate_after(4)
    assert [(r["kind"], r["step"]) for r in read_metrics(tmp_path)] == [
        ("train", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4), ("eval", 4)]
    assert (tmp_path / "metrics.jsonl").read_text().endswith("}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "tensorboard"]  # no temporary file left
    writer.write("train", 5, {"loss": 50.0})  # the resumed run appends after a whole line
    writer.close()
    expected = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 50)]
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path, "train")] == expected
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()  # TensorBoard too shows the replayed step once, with its new value
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == expected


def test_a_corrupt_line_before_the_last_is_an_error(tmp_path):
    lines = ['{"kind": "train", "step": 1}', '{"kind": "tr', '{"kind": "train", "step": 2}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl:2: not a JSON object"):
        read_metrics(tmp_path)


def test_wandb_without_the_package_is_a_clear_error(tmp_path):
    from loraflow.config import load_config

    assert load_config(None, ["output.wandb=my-project"]).output.wandb == "my-project"
    assert importlib.util.find_spec("wandb") is None  # this environment does not install it
    with pytest.raises(ConfigError, match=r"pip install wandb.*unset output.wandb"):
        MetricsWriter(tmp_path, tensorboard=False, wandb_project="my-project")
    MetricsWriter(tmp_path, tensorboard=False, wandb_project="")  # off: no error
