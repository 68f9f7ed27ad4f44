"""Resume that means what it says (run/directory.py, engines/base.py sync_learning_rate): changing the learning-rate
schedule on --resume is refused with the ways forward, and --extend continues to a longer train.max_steps on the
schedule rebuilt for it, as if the longer run had been asked from the start."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraflow.commands.cli import main
from loraflow.errors import ConfigError
from loraflow.loop.metrics import read_metrics
from loraflow.run.train import train


def common(tiny_model, chat_data, run_dir, *extra):
    return [f"model.path={tiny_model}", f"data.train={chat_data[0]}", "data.eval=", f"output.dir={run_dir}",
            "output.progress_bar=false", "output.tensorboard=false", "output.log_every_steps=1",
            "train.micro_batch_size=4", "train.learning_rate=5e-3", "train.schedule=linear", "adapter.dropout=0.1",
            *extra]


def logged(run_dir: Path, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir, "train")}


def test_changing_the_schedule_on_resume_is_refused_with_the_ways_forward(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=2", "output.save_every_steps=2"), None)
    with pytest.raises(ConfigError) as refused:
        train("sft", None, ["train.max_steps=4"], str(run))
    (message,) = refused.value.problems
    assert "Resume without changing train.max_steps" in message and "add --extend" in message
    assert "start a new run (another output.dir)" in message
    with pytest.raises(ConfigError, match="not train.max_steps=0"):
        train("sft", None, ["train.max_steps=0"], str(run), extend=True)
    with pytest.raises(ConfigError, match="add train.max_steps=N"):
        train("sft", None, [], str(run), extend=True)
    with pytest.raises(ConfigError) as refused:  # --extend lengthens; it changes no other part of the schedule
        train("sft", None, ["train.max_steps=4", "train.warmup_steps=2"], str(run), extend=True)
    assert [p.split("=")[0] for p in refused.value.problems] == ["train.max_steps", "train.warmup_steps"]
    with pytest.raises(ConfigError, match="already has a checkpoint at step 2, so nothing would be trained"):
        train("sft", None, ["train.max_steps=1"], str(run), extend=True)  # shorter than the steps already taken
    assert main(["train", "sft", "--extend", "train.max_steps=4"]) == 2  # --extend without --resume
    assert [r["step"] for r in read_metrics(run, "train")] == [1, 2]  # nothing ran


@pytest.mark.parametrize("warmup", [4, 0])
def test_extend_gives_the_longer_schedule_from_the_checkpoint_on(tiny_model, chat_data, tmp_path, warmup):
    """warmup 4: the 3 steps before the checkpoint are warmup in both schedules, so the extended run equals the
    uninterrupted 6-step run in every rate and loss. warmup 0: the 3-step run decayed faster; from the checkpoint
    on the rates are the 6-step run's (the first resumed step included: the optimizer state had restored the
    3-step schedule's rate)."""
    schedule = f"train.warmup_steps={warmup}"
    full, part = tmp_path / "full", tmp_path / "part"
    train("sft", None, common(tiny_model, chat_data, full, "train.max_steps=6", schedule), None)
    train("sft", None, common(tiny_model, chat_data, part, "train.max_steps=3", "output.save_every_steps=3",
                              schedule), None)
    short = logged(part, "lr")
    assert train("sft", None, ["train.max_steps=6"], str(part), extend=True)["steps"] == 6
    lr, lr_full = logged(part, "lr"), logged(full, "lr")
    assert list(lr) == list(range(1, 7))
    assert [lr[s] for s in (4, 5, 6)] == pytest.approx([lr_full[s] for s in (4, 5, 6)], rel=1e-12)
    assert [lr[s] for s in (1, 2, 3)] == [short[s] for s in (1, 2, 3)]
    if warmup:
        assert lr == pytest.approx(lr_full, rel=1e-12)
        assert logged(part, "loss") == pytest.approx(logged(full, "loss"), rel=1e-6)
    else:
        assert lr[3] != lr_full[3]  # the 3-step schedule decayed faster
    log = (part / "train.log").read_text()
    assert "--extend: train.max_steps 3 -> 6" in log and "as if they had been asked from the start" in log
