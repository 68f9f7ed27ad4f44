"""Stop signals on two processes, through `loraflow train` under torchrun as a user meets them: a signal to one rank
stops both at the same step with a checkpoint of it (the one-process cases and the other faults are in
tests/test_faults.py; docs/reliability.md is the table)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import fault_run_args as common
from conftest import steps_logged, wait_for_step

from loraflow.engines.launch import launch_env, torchrun_argv


def worker_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of torchrun's workers (read from their environment)."""
    out = {}
    for child in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        rank = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
        if rank:
            out[int(rank[0])] = int(child)
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_two_ranks_stop_together_when_one_is_signalled(tiny_model, chat_data, tmp_path, signum):
    run = tmp_path / "run"
    tail = ["-m", "loraflow", "train", "sft", *common(tiny_model, chat_data, run, "train.max_steps=400",
                                                       "parallel.engine=ddp", "train.micro_batch_size=2")]
    log = tmp_path / "launch.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(torchrun_argv(2, tail), stdout=sink, stderr=subprocess.STDOUT, env=launch_env(),
                                start_new_session=True)
        try:
            wait_for_step(run, 2, proc, timeout=240)
            pids = worker_pids(proc.pid)
            assert set(pids) == {0, 1}, pids
            os.kill(pids[1], signum)  # only rank 1, as when a node's tasks are signalled one by one
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text, name = log.read_text(), signal.Signals(signum).name
    assert f"stopped by {name} after step" in text, text[-4000:]  # said by rank 0, which was not signalled
    step = int(text.split(f"stopped by {name} after step ")[1].split()[0])
    assert (run / "latest").read_text().strip() == f"step-{step:07d}"
    assert steps_logged(run) == list(range(1, step + 1))
