"""A checkpoint save on two real ranks (gloo): a rank whose save fails (a full disk for its engine files,
non-finite weights) gives every rank the same error instead of leaving the others waiting at a barrier, and the
previous checkpoint stays the one to resume. The one-process checkpoint faults are in
tests/test_checkpoint_faults.py, whose helpers both ranks import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT
from test_checkpoint_faults import MARKER, assert_untouched

TWO_RANKS = textwrap.dedent("""
    import errno, json, sys, torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from test_checkpoint_faults import LORA_A, save, tiny_peft, weights_of
    from loraflow.errors import LoraflowError
    dist.init_process_group("gloo")

    class GlooEngine:  # the two members of loraflow's engine interface a save uses, over a real process group
        rank, world_size, failing = dist.get_rank(), dist.get_world_size(), False

        def gather_objects(self, obj):
            out = [None] * self.world_size
            dist.all_gather_object(out, obj)
            return out

        def save_engine_files(self, directory):  # DeepSpeed's per-rank files; rank 1's disk fills on demand
            if self.failing and self.rank == 1:
                raise OSError(errno.ENOSPC, "No space left on device", str(directory / "rank1.pt"))
            torch.save({"rank": self.rank}, directory / f"rank{self.rank}.pt")

    run, engine, (model, opt), out = Path(sys.argv[2]), GlooEngine(), tiny_peft(), {}
    save(run, 1, model, opt, engine=engine)
    for case in ("engine files", "non-finite"):
        engine.failing = case == "engine files"
        weights = weights_of(model, 2)
        if case == "non-finite" and engine.rank == 0:
            weights[LORA_A][0, 0] = float("nan")
        try:
            save(run, 2, model, opt, weights=weights, engine=engine)
            out[case] = None
        except LoraflowError as exc:
            out[case] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
    dist.destroy_process_group()
""")


def test_a_failure_on_one_rank_is_the_same_error_on_every_rank(tmp_path):
    """A rank that fails must not leave the others waiting at a barrier forever (the timeout would catch a hang)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(ROOT / "tests"), str(run)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    found = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-3000:]
            found.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # a hang (one rank waiting for another that gave up) ends here, not in the next test
            proc.kill()
            proc.wait()
    own, told = found[1]["engine files"], found[0]["engine files"]
    assert own[0] == told[0] == "DiskFullError"
    assert own[1].startswith("no space left on device while writing checkpoint step-0000002")
    assert told[1] == f"rank 1 could not write the checkpoint: {own[1]}"
    own, told = found[0]["non-finite"], found[1]["non-finite"]
    assert own[0] == told[0] == "NonFiniteError" and told[1] == f"rank 0 could not write the checkpoint: {own[1]}"
    assert {"rank0.pt", "rank1.pt"} <= set(json.loads((run / "checkpoints/step-0000001" / MARKER).read_text())["files"])
    assert_untouched(run)
