"""rl.rewards as users write them: a file beside the run (path/to/file.py:function), a module in the working
directory run through the `loraflow` console script (whose sys.path[0] is its bin directory, not the working
directory), TRL's calling convention, and an error per way an entry can be wrong, naming the entry and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from loraflow.config import load_config
from loraflow.data.formatting import IGNORE
from loraflow.environment import detect_environment
from loraflow.errors import ConfigError, LoraflowError
from loraflow.rl.rewards import RewardInputs, load_reward_functions
from loraflow.run.config import demo_config
from loraflow.run.pipeline import build_run

SMALL = ["rl.group_size=2", "rl.max_new_tokens=4", "train.micro_batch_size=2", "data.eval=",
         "data.train=builtin:reverse/prompts-train.jsonl*0.01", "output.progress_bar=false",
         "output.tensorboard=false"]


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def problems(entries: list[str], columns=frozenset({"answer"})) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_reward_functions(entries, "rl.rewards", columns)
    return info.value.problems


# Each way an entry can be wrong is refused before training, every problem at once, each naming its entry, what
# was tried, and the fix.
def test_every_wrong_entry_is_named_with_its_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "mine.py", """\
        VALUE = 3
        def takes_nothing_useful(x):
            return [0.0]
        def needs_solution(completions, solution):
            return [0.0] * len(completions)
        def fine(completions, **kwargs):
            return [0.0] * len(completions)
        async def later(completions, **kwargs):
            return [0.0] * len(completions)
    """)
    write(tmp_path / "broken.py", """\
        import os
        raise RuntimeError("the user's own bug")
    """)
    found = problems(["missing.py:f", "mine.py:nope", "mine.py:VALUE", "broken.py:f", "mine.py:takes_nothing_useful",
                      "mine.py:needs_solution", "not_a_module_here:f", "mine.py:later"])
    assert len(found) == 8
    missing, nope, value, broken, signature, solution, module, later = found
    assert f"no file {tmp_path / 'missing.py'}" in missing and "relative to the working directory" in missing
    assert "mine.py defines no `nope`" in nope and "fine" in nope and "takes_nothing_useful" in nope
    assert "`VALUE` is of type int, not a function" in value
    # The user's line, not importlib's.
    assert f"{tmp_path / 'broken.py'}, line 2: raise RuntimeError(\"the user's own bug\")" in broken
    assert "RuntimeError: the user's own bug" in broken
    assert "takes neither `completions` nor **kwargs" in signature and "fn(completions, fields)" in signature
    assert "requires solution" in solution and "prompt records' fields (answer)" in solution
    assert "no module not_a_module_here in the working directory" in module
    assert "`later` is an async function" in later
    assert all(p.startswith("rl.rewards: ") for p in found)


# TRL's form gets TRL's keywords: chat prompts as messages, each completion as one assistant message, the token ids,
# and every field of the records as a column; a function without **kwargs gets only what it names. loraflow's own
# form (a `fields` parameter) is called as before. None counts 0, as under TRL's nansum.
def test_trl_and_loraflow_forms_get_their_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "forms.py", """\
        seen = {}
        def trl_style(prompts, completions, completion_ids, answer, **kwargs):
            seen["trl"] = dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                               answer=answer, extra=sorted(kwargs))
            return [None if c[0]["content"] == "" else 1.0 for c in completions]
        def names_two(completions, answer):
            seen["two"] = (completions, answer)
            return [0.5] * len(completions)
        def own_style(completions, fields):
            return [float(c == f["answer"]) for c, f in zip(completions, fields)]
    """)
    rewards = load_reward_functions(["forms.py:trl_style", "forms.py:names_two", "forms.py:own_style"],
                                    "rl.rewards", {"answer", "level"})
    chat = [{"role": "user", "content": "Reverse: ab"}]
    inputs = RewardInputs(["ba", ""], [{"answer": "ba", "level": 1}, {"answer": "ba"}], [chat, chat], [[5, 6, 2], [2]])
    assert [f(inputs) for f in rewards] == [[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]]
    seen = sys.modules[rewards[0].fn.__module__].seen
    assert seen["trl"] == dict(prompts=[chat, chat], completions=[[{"role": "assistant", "content": "ba"}],
                                                                   [{"role": "assistant", "content": ""}]],
                               completion_ids=[[5, 6, 2], [2]], answer=["ba", "ba"], extra=["level"])
    assert seen["two"] == ([[{"role": "assistant", "content": "ba"}], [{"role": "assistant", "content": ""}]],
                           ["ba", "ba"])
    # Plain-text prompts: completions are strings, as TRL passes them.
    load_reward_functions(["forms.py:names_two"], "rl.rewards", {"answer"})[0](
        RewardInputs(["x"], [{"answer": "y"}], ["Reverse: ab"], [[3]]))
    assert seen["two"] == (["x"], ["y"])


def test_a_function_that_fails_or_returns_the_wrong_shape_names_its_entry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "bad.py", """\
        def text_only(completions, **kwargs):
            return [float(c.startswith("a")) for c in completions]
        def short(completions, **kwargs):
            return [1.0]
        def not_a_number(completions, **kwargs):
            return [1.0, float("nan")]
    """)
    text_only, short, nan = load_reward_functions(["bad.py:text_only", "bad.py:short", "bad.py:not_a_number"])
    chat = RewardInputs(["a", "b"], [{}, {}], [[{"role": "user", "content": "q"}]] * 2, [[1], [2]])
    with pytest.raises(LoraflowError, match=r"bad.py:text_only raised .*bad.py, line 2: .*read completion\[0\]"):
        text_only(chat)
    with pytest.raises(LoraflowError, match="bad.py:short returned 1 values for 2 completions"):
        short(chat)
    with pytest.raises(LoraflowError, match="bad.py:not_a_number returned nan for completion 1.*None for no reward"):
        nan(chat)


# A reward in a file of the user's (relative to the working directory, importing a helper beside it) trains a real
# GRPO step: the rewards in the step's batch are the function's, row by row (here: each completion's length).
def test_a_file_reward_trains_a_grpo_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "rewards" / "helper.py", "def count(ids):\n    return float(len(ids))\n")
    write(tmp_path / "rewards" / "lengths.py", """\
        from helper import count
        def length(prompts, completions, completion_ids, answer, **kwargs):
            assert all(isinstance(p, list) for p in prompts) and len(answer) == len(completions)
            return [count(ids) for ids in completion_ids]
    """)
    config = load_config(str(demo_config("grpo")), ["stage=grpo", *SMALL, "rl.rewards=[rewards/lengths.py:length]",
                                                    f"output.dir={tmp_path / 'run'}"])
    trainer = build_run(config, detect_environment(), tmp_path / "run").trainer
    stats = trainer.accumulate()
    batch = trainer.prepared[0][0][0]
    lengths = (batch["labels"] != IGNORE).sum(dim=1).float()
    assert batch["rewards"].tolist() == lengths.tolist()
    assert stats["reward"] == pytest.approx(float(lengths.mean()))


# The reported bug: `rl.rewards: [myrewards:caps]` with myrewards.py in the working directory, run by the console
# script, whose sys.path[0] is the venv's bin directory (`python -m` would have put the working directory there).
def test_a_module_in_the_working_directory_is_found_by_the_console_script(tmp_path):
    script = Path(sys.executable).parent / "loraflow"
    assert script.is_file(), f"no `loraflow` console script beside {sys.executable}: pip install -e . installs it"
    write(tmp_path / "myrewards.py", """\
        import json
        def letters(completions, **kwargs):  # any score that differs between completions, so GRPO has a gradient
            with open("calls.jsonl", "a") as f:
                f.write(json.dumps({"n": len(completions), "keys": sorted(kwargs)}) + "\\n")
            return [sum(map(ord, c[0]["content"])) % 97 / 97 for c in completions]
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}  # this checkout, not cwd
    run = subprocess.run([sys.executable, str(script), "train", "grpo", "rl.rewards=[myrewards:letters]",
                          "train.max_steps=1", *SMALL, f"output.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls == [{"n": 4, "keys": ["answer", "completion_ids", "prompts"]}]
