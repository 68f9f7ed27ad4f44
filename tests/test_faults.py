"""Fault injection through `loraflow train`, as a user meets each fault: divergence, stop signals (one process
here; two in tests/distributed/test_faults_distributed.py), a run that never wrote a checkpoint, directories holding
other files, replayed metrics, a full disk, a read-only output directory, corrupt checkpoint files, undecodable
data, an attention kernel the architecture refuses. Each case asserts the message the user sees and that nothing
already written is lost. (docs/reliability.md is the table of these cases.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fault_run_args as common
from conftest import steps_logged, wait_for_step
from safetensors.torch import load_file

from loraflow.commands.cli import main as cli
from loraflow.engines.launch import launch_env
from loraflow.errors import ConfigError, LoraflowError
from loraflow.run.train import train


# -- divergence ---------------------------------------------------------------------------------------------------

def test_a_diverging_run_stops_before_the_update_and_keeps_the_last_good_checkpoint(tiny_model, chat_data, tmp_path,
                                                                                     capsys):
    run = tmp_path / "run"
    # Clipping off and an absurd learning rate: the first update is finite but throws the weights so far that the
    # second step's loss (or gradients) are not; a checkpoint after step 1 is the last good state.
    code = cli(["train", "sft", *common(tiny_model, chat_data, run, "train.learning_rate=1e30",
                                        "train.max_grad_norm=0", "train.max_steps=6", "output.save_every_steps=1")])
    err = capsys.readouterr().err
    assert code == 2 and "a bug" not in err
    assert "training diverged at step 2" in err
    assert "train.learning_rate=1e+30" in err and "train.max_grad_norm=0" in err
    assert (run / "latest").read_text().strip() == "step-0000001"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001"]
    weights = load_file(run / "checkpoints/step-0000001/adapter_model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())
    assert not (run / "adapter").exists()  # the final adapter is never written from a diverged run
    assert "ERROR run failed: DivergenceError: training diverged at step 2" in (run / "train.log").read_text()
    assert cli(["explain", str(run / "train.log")]) == 0  # the log alone says what ended the run
    out = capsys.readouterr().out
    assert "framework loraflow" in out and "DivergenceError: training diverged at step 2" in out


def test_vanishing_gradients_are_warned_about_once(caplog):
    """A saturated model (seen with clipping on and learning_rate=1e6 on larger models) has gradient norm 0 and a
    loss that sits still: the steps' numbers go through the watch the trainer uses, with a real plan."""
    from loraflow.config import load_config
    from loraflow.loop.divergence import ZERO_GRAD_STEPS, DivergenceWatch
    from loraflow.environment import detect_environment
    from loraflow.plan import resolve
    from loraflow.run.config import demo_config

    plan = resolve(load_config(demo_config("sft"), ["train.learning_rate=1e6"]), detect_environment())
    watch = DivergenceWatch(plan)
    caplog.set_level("WARNING", logger="loraflow")
    for step, norm in enumerate([3.0, 0.0, 0.0, 1.0, *[0.0] * (ZERO_GRAD_STEPS + 3)], 1):
        watch.check_loss(step, 2.5)
        watch.check_gradients(step, norm, applied=False)
    warned = [r.getMessage() for r in caplog.records if "exactly 0" in r.getMessage()]
    assert len(warned) == 1 and f"steps 5-{4 + ZERO_GRAD_STEPS}" in warned[0]
    assert "train.learning_rate=1e+06" in warned[0]


# -- stop signals -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_stop_signal_saves_a_checkpoint_and_the_run_resumes(tiny_model, chat_data, tmp_path, signum):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "loraflow", "train", "sft",
            *common(tiny_model, chat_data, run, "train.max_steps=400")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_env())
    wait_for_step(run, 2, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    name = signal.Signals(signum).name
    assert f"stopped by {name} after step" in err and f"--resume {run}" in err and "a bug" not in err
    step = int(err.split(f"stopped by {name} after step ")[1].split()[0])
    assert (run / "latest").read_text().strip() == f"step-{step:07d}"
    assert steps_logged(run) == list(range(1, step + 1))
    assert f"run stopped: Stopped: stopped by {name}" in (run / "train.log").read_text()
    # --extend: a shorter length than the 400 asked, on the schedule rebuilt for it (the test only needs 2 steps more)
    summary = train("sft", None, [f"train.max_steps={step + 2}"], str(run), extend=True)
    assert summary["steps"] == step + 2
    assert steps_logged(run) == list(range(1, step + 3))  # the replayed steps are not logged twice


# -- directories ----------------------------------------------------------------------------------------------------

def test_a_run_without_a_checkpoint_restarts_in_place(tiny_model, chat_data, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["train", "sft", *common(tiny_model, chat_data, run, "train.learning_rate=1e30",
                                        "train.max_grad_norm=0", "train.max_steps=4")]) == 2
    err = capsys.readouterr().err
    assert f"--restart {run}" in err
    assert cli(["train", "sft", "--resume", str(run)]) == 2
    assert f"--restart {run}" in capsys.readouterr().err
    assert cli(["train", "sft", *common(tiny_model, chat_data, run, "train.max_steps=2")]) == 2
    assert f"--restart {run}" in capsys.readouterr().err
    assert cli(["train", "sft", "--restart", str(run), "train.learning_rate=5e-3", "train.max_grad_norm=1",
                "train.max_steps=2"]) == 0
    assert steps_logged(run) == [1, 2]
    kept = run / "earlier-attempts/1"
    assert "DivergenceError" in (kept / "train.log").read_text() and (kept / "config.yaml").is_file()
    assert "DivergenceError" not in (run / "train.log").read_text()


def test_a_directory_holding_other_files_is_refused_and_left_alone(tiny_model, chat_data, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text('{"my": "numbers"}\n')
    code = cli(["train", "sft", *common(tiny_model, chat_data, mine, "train.max_steps=1")])
    assert code == 2 and "already holds files (metrics.jsonl)" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["metrics.jsonl"]
    assert (mine / "metrics.jsonl").read_text() == '{"my": "numbers"}\n'


def test_a_user_model_never_gets_the_demo_settings(tiny_model, chat_data, tmp_path):
    from loraflow.run.config import load_run_config

    mine = load_run_config("sft", None, [f"model.path={tiny_model}", f"data.train={chat_data[0]}"])
    assert mine.data.eval is None and mine.model.merge_adapters == []  # no demo eval set: no eval at all
    demo = load_run_config("sft", None, ["train.max_steps=3"])
    assert demo.model.path == "builtin:tiny-base" and demo.data.eval
    # An RL stage on a user's model: the demo's merged SFT adapter (built for the tiny base) does not follow.
    with pytest.raises(ConfigError, match="rl.rewards"):
        load_run_config("grpo", None, [f"model.path={tiny_model}", f"data.train={chat_data[0]}"])
    grpo = load_run_config("grpo", None, [f"model.path={tiny_model}", f"data.train={chat_data[0]}",
                                          "rl.rewards=[builtin:reverse_partial]"])
    assert grpo.model.merge_adapters == []
    with pytest.raises(LoraflowError, match="data.train"):
        train("sft", None, [f"model.path={tiny_model}", f"output.dir={tmp_path / 'r'}"], None)


def test_train_log_has_step_lines_and_no_bar_when_not_a_terminal(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "loraflow", "train", "sft",
                           *[o for o in common(tiny_model, chat_data, run, "train.max_steps=4",
                                               "output.log_every_steps=2") if o != "output.progress_bar=false"]],
                          capture_output=True, text=True, env=launch_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "step 2/4: loss" in log and "step 4/4: loss" in log
    assert "\r" not in proc.stdout + proc.stderr  # no redraws piled onto one line


# -- the disk and the files ------------------------------------------------------------------------------------------

def fill(directory: Path) -> None:
    """Write zeros into `directory` until its file system is full."""
    with (directory / "filler").open("wb", buffering=0) as fh:  # unbuffered: closing has nothing left to flush
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
        except OSError:  # ENOSPC: full
            pass


def limit_file_size() -> None:  # preexec_fn of a run with no small file system to be had: each file <= 200 kB
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def test_a_full_disk_is_said_plainly_and_the_last_checkpoint_stays(tiny_model, chat_data, tmp_path):
    from test_checkpoint_faults import small_tmpfs

    from loraflow.checkpoints.integrity import problems

    with small_tmpfs(tmp_path / "disk", "4m") as mounted:
        run = tmp_path / "disk/run"
        argv = [sys.executable, "-m", "loraflow", "train", "sft",
                *common(tiny_model, chat_data, run, "train.max_steps=400", "output.save_every_steps=1")]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_env(),
                                preexec_fn=None if mounted else limit_file_size)
        if mounted:  # a real disk that fills while the run goes on
            deadline = time.monotonic() + 120
            while not (run / "latest").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            fill(tmp_path / "disk")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err[-3000:]
        assert "a bug" not in err
        assert "no space left on device" in err or "not enough space" in err, err[-3000:]
        if mounted:
            (tmp_path / "disk/filler").unlink()
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]
        if mounted:  # checkpoints were written before the disk filled: the newest is intact and `latest`
            latest = run / "checkpoints" / (run / "latest").read_text().strip()
            assert problems(latest) == []
        else:  # every checkpoint outgrows the limit: the first save fails, and leaves nothing half-written
            assert "step-0000001" in err and not (run / "latest").exists()


def test_a_read_only_output_directory_fails_before_loading_anything(tiny_model, chat_data, tmp_path, capsys):
    from test_checkpoint_faults import read_only

    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    with read_only(out, "mount"):
        code = cli(["train", "sft", *common(tiny_model, chat_data, out / "run", "train.max_steps=1")])
    err = capsys.readouterr().err
    assert code == 2 and "a bug" not in err
    assert f"cannot write the run's files to {out / 'run'}" in err and "output.dir" in err
    assert not (out / "run").exists()


@pytest.mark.parametrize("damage", ["flip a byte of the adapter", "truncate the trainer state"])
def test_a_damaged_latest_checkpoint_resumes_from_the_one_before(tiny_model, chat_data, tmp_path, damage):
    run = tmp_path / "run"
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=4", "output.save_every_steps=2"), None)
    newest = run / "checkpoints/step-0000004"
    if damage.startswith("flip"):
        f = newest / "adapter_model.safetensors"
        data = bytearray(f.read_bytes())
        data[-10] ^= 0x01
        f.write_bytes(bytes(data))
    else:
        f = newest / "trainer_state.pt"
        f.write_bytes(f.read_bytes()[:100])
    summary = train("sft", None, ["train.max_steps=6"], str(run), extend=True)
    assert summary["steps"] == 6
    log = (run / "train.log").read_text()
    assert f.name in log and "falling back to step 2" in log
    assert "resumed from" in log and "step-0000002 at step 2" in log
    assert (run / "checkpoints/corrupt-step-0000004" / f.name).is_file()  # set aside, never deleted
    assert steps_logged(run) == list(range(1, 7))


def test_undecodable_data_names_the_file_line_and_byte(tiny_model, chat_data, tmp_path, capsys):
    data = tmp_path / "latin1.jsonl"
    lines = Path(chat_data[0]).read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"Reverse", "Revérse".encode("latin-1"))
    data.write_bytes(b"".join(lines))
    run = tmp_path / "run"
    code = cli(["train", "sft", *common(tiny_model, (data, None), run, "train.max_steps=1")])
    err = capsys.readouterr().err
    assert code == 2 and "a bug" not in err
    assert str(data) in err and "line 3" in err and "byte" in err
    assert not (run / "config.yaml").exists()  # the run never started: the directory takes a corrected retry


def test_wandb_asked_for_but_not_installed_fails_before_the_model_loads(tiny_model, chat_data, tmp_path, capsys):
    run = tmp_path / "run"
    code = cli(["train", "sft", *common(tiny_model, chat_data, run, "output.wandb=my-project")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install wandb" in err and "a bug" not in err
    assert not (run / "train.log").exists()
