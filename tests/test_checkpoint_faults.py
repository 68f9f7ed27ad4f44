"""Checkpoints under environment faults: damaged files on resume, non-finite weights, a full disk, a read-only
output directory. Real peft models, real save and load functions, real file systems: a small tmpfs where this
machine lets the test mount one (root), else a child process under a file size limit (RLIMIT_FSIZE), which fails
a write the same way on every machine. (A failure on one of two ranks:
tests/distributed/test_checkpoint_faults_distributed.py.)"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from loraflow.checkpoints.store import export_weights, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint
from loraflow.checkpoints.integrity import MARKER, problems
from loraflow.errors import CheckpointError, DiskFullError, NonFiniteError, OutputError
from loraflow.checkpoints.storage import check_writable

ADAPTER, STATE = "adapter_model.safetensors", "trainer_state.pt"
LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"


def tiny_peft(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A 2-layer, 64-wide Llama with LoRA on q and v, after one AdamW step (so the optimizer has state)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    ids = torch.tensor([[1, 5, 9, 2]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return model, opt


def weights_of(model, shift: float = 0.0) -> dict[str, torch.Tensor]:
    """The trainable tensors as the engines gather them; `shift` makes each step's checkpoint distinguishable."""
    return {n: p.detach().clone() + shift for n, p in model.named_parameters() if p.requires_grad}


def save(run: Path, step: int, model, opt, extra: dict | None = None, weights=None, keep: int = 3, engine=None):
    state = {"progress": {"step": step}, "rng": [rng_state()], "optimizer": opt.state_dict(), **(extra or {})}
    return save_checkpoint(run, step, model, weights if weights is not None else weights_of(model, step), state,
                           keep, engine)


def names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def assert_untouched(run: Path, step: int = 1) -> None:
    """The failed save left nothing behind, and the previous checkpoint is still the one to resume."""
    assert not [n for n in names(run) if n.startswith(".tmp")]
    assert (run / "latest").read_text().strip() == f"step-{step:07d}"
    assert problems(run / "checkpoints" / f"step-{step:07d}") == []
    assert latest_checkpoint(run).name == f"step-{step:07d}"


@pytest.fixture(scope="module")
def peft():
    return tiny_peft()


def flip_byte(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


def truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


DAMAGE = {"flipped byte": (ADAPTER, flip_byte, "checksum differs"),
          "truncated": (STATE, truncate, "size differs"),
          "deleted": (ADAPTER, Path.unlink, "is missing")}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(peft, tmp_path, caplog, damage):
    model, opt = peft
    run = tmp_path / "run"
    save(run, 1, model, opt)
    save(run, 2, model, opt)
    victim, harm, what = DAMAGE[damage]
    harm(run / "checkpoints/step-0000002" / victim)
    with caplog.at_level(logging.WARNING, logger="loraflow"):
        chosen = latest_checkpoint(run)
    assert chosen.name == "step-0000001"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "loraflow"]
    assert len(warned) == 1
    assert f"step-0000002/{victim} {what}" in warned[0] and "falling back to step 1" in warned[0]
    # Kept, out of the way: not counted among output.keep_checkpoints, never replaced by a re-saved step 2.
    assert names(run) == ["corrupt-step-0000002", "step-0000001"]
    fresh, _ = tiny_peft(seed=1)
    assert load_checkpoint(chosen, fresh)["progress"] == {"step": 1}
    assert torch.equal(fresh.state_dict()[LORA_A], weights_of(model, 1)[LORA_A])
    for step in (2, 3):
        save(run, step, model, opt, keep=2)
    assert names(run) == ["corrupt-step-0000002", "step-0000002", "step-0000003"]
    assert latest_checkpoint(run).name == "step-0000003"


def test_no_checkpoint_verifies_names_each_bad_file(peft, tmp_path):
    model, opt = peft
    run = tmp_path / "run"
    save(run, 1, model, opt)
    save(run, 2, model, opt)
    flip_byte(run / "checkpoints/step-0000002" / ADAPTER)
    truncate(run / "checkpoints/step-0000001" / STATE)
    with pytest.raises(CheckpointError) as exc:
        latest_checkpoint(run)
    message = str(exc.value)
    assert f"step-0000002/{ADAPTER} checksum differs" in message
    assert f"step-0000001/{STATE} size differs" in message
    assert "without --resume" in message
    assert names(run) == ["corrupt-step-0000001", "corrupt-step-0000002"]  # both kept


def test_files_an_engine_writes_are_covered_by_the_checksums(peft, tmp_path, caplog):
    """DeepSpeed writes its per-rank optimizer partitions into the temporary directory before rank 0 seals it;
    this engine writes one such file the same way (a stand-in for loraflow's engine interface, one process)."""
    class OneRankEngine:
        rank, world_size = 0, 1

        def gather_objects(self, obj):
            return [obj]

        def save_engine_files(self, directory):
            (directory / "deepspeed/state").mkdir(parents=True)
            torch.save({"moments": torch.randn(64)}, directory / "deepspeed/state/zero_pp_rank_0_optim_states.pt")

    model, opt = peft
    run = tmp_path / "run"
    for step in (1, 2):
        save(run, step, model, opt, engine=OneRankEngine())
    listed = json.loads((run / "checkpoints/step-0000002" / MARKER).read_text())["files"]
    assert "deepspeed/state/zero_pp_rank_0_optim_states.pt" in listed
    flip_byte(run / "checkpoints/step-0000002/deepspeed/state/zero_pp_rank_0_optim_states.pt")
    with caplog.at_level(logging.WARNING, logger="loraflow"):
        assert latest_checkpoint(run).name == "step-0000001"
    assert "zero_pp_rank_0_optim_states.pt checksum differs" in caplog.text


def make_pre_checksum(checkpoint: Path) -> None:
    """Rewrite the marker as checkpoints were written before checksums existed: the top-level names only."""
    marker = checkpoint / MARKER
    step = json.loads(marker.read_text())["step"]
    marker.write_text(json.dumps({"step": step, "files": sorted(p.name for p in checkpoint.iterdir()
                                                                if p.name != MARKER)}))


def test_a_checkpoint_from_before_checksums_is_verified_by_reading_it(peft, tmp_path, caplog):
    model, opt = peft
    run = tmp_path / "run"
    for step in (1, 2):
        make_pre_checksum(save(run, step, model, opt))
    fresh, _ = tiny_peft(seed=1)
    assert latest_checkpoint(run).name == "step-0000002"
    assert load_checkpoint(run / "checkpoints/step-0000002", fresh)["progress"] == {"step": 2}
    assert torch.equal(fresh.state_dict()[LORA_A], weights_of(model, 2)[LORA_A])

    truncate(run / "checkpoints/step-0000002" / STATE)
    with pytest.raises(CheckpointError, match=rf"step-0000002/{STATE} cannot be read"):
        load_checkpoint(run / "checkpoints/step-0000002", fresh)  # not a raw torch error
    with caplog.at_level(logging.WARNING, logger="loraflow"):
        assert latest_checkpoint(run).name == "step-0000001"
    assert f"step-0000002/{STATE} cannot be read" in caplog.text and "falling back to step 1" in caplog.text

    truncate(run / "checkpoints/step-0000001" / ADAPTER)
    with pytest.raises(CheckpointError, match=rf"step-0000001/{ADAPTER} cannot be read"):
        load_checkpoint(run / "checkpoints/step-0000001", fresh)  # not a raw safetensors error


def test_non_finite_weights_are_refused_and_nothing_is_written(peft, tmp_path):
    model, opt = peft
    run = tmp_path / "run"
    save(run, 1, model, opt)
    bad = weights_of(model)
    poisoned = [n for n in bad if "lora_B" in n][:2]
    bad[poisoned[0]][0, 0] = float("nan")
    bad[poisoned[1]][1, 1] = float("inf")
    with pytest.raises(NonFiniteError) as exc:
        save(run, 2, model, opt, weights=bad)
    assert f"2 of {len(bad)} weight tensors hold NaN or Inf" in str(exc.value)
    assert all(name in str(exc.value) for name in poisoned)
    assert names(run) == ["step-0000001"]
    assert_untouched(run)
    with pytest.raises(NonFiniteError, match="final weights"):
        export_weights(model, run / "adapter", bad)
    assert not (run / "adapter").exists() and not [p for p in run.iterdir() if p.name.startswith(".tmp")]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """Yield True with a tmpfs of `size` mounted at `path`, or False where this process may not mount."""
    path.mkdir(parents=True)
    try:
        mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                                        str(path)], check=False, capture_output=True).returncode == 0
    except FileNotFoundError:  # no mount(8)
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_save_that_does_not_fit_is_refused_before_writing(peft, tmp_path, monkeypatch):
    model, opt = peft
    blob = {"blob": torch.zeros(50_000)}  # 200 kB of tensors: the first save fits in 600k, a second does not
    with small_tmpfs(tmp_path / "disk", "600k") as mounted:
        run = tmp_path / "disk/run"
        save(run, 1, model, opt, extra=blob)
        if not mounted:  # no small file system to be had: the disk reports what a nearly full one would
            usage = shutil.disk_usage(run)
            monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=300_000))
        with pytest.raises(DiskFullError) as exc:
            save(run, 2, model, opt, extra=blob)
        message = str(exc.value)
        assert f"not enough space to write checkpoint step-0000002 in {run / 'checkpoints'}" in message
        assert "Nothing was written" in message and "output.keep_checkpoints" in message and "output.dir" in message
        monkeypatch.undo()
        assert_untouched(run)


CHILD = textwrap.dedent("""
    import json, resource, signal, sys, torch
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from test_checkpoint_faults import save, tiny_peft, weights_of
    from loraflow.errors import DiskFullError
    run, cases, out = Path(sys.argv[2]), sys.argv[3].split(","), {}
    model, opt = tiny_peft()
    save(run, 1, model, opt)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, not a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    for case in cases:
        try:
            if case == "torch":  # trainer_state.pt outgrows the limit inside torch.save's C++ writer
                save(run, 2, model, opt, extra={"blob": bytes(700_000)})
            else:  # a trained tensor outside the adapter (PPO's value head) goes through safetensors
                save(run, 2, model, opt, weights={**weights_of(model), "v_head.weight": torch.zeros(100_000)})
            out[case] = None
        except DiskFullError as exc:
            out[case] = str(exc)
    print(json.dumps(out))
""")


def run_under_file_size_limit(run: Path, cases: list[str]) -> dict[str, str | None]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), str(run), ",".join(cases)],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_disk_that_fills_during_a_save_leaves_the_previous_checkpoint(peft, tmp_path):
    """The estimate cannot see everything (here a large non-tensor object in the trainer state), so the disk
    fills in the middle of torch.save."""
    model, opt = peft
    with small_tmpfs(tmp_path / "disk", "600k") as mounted:
        run = tmp_path / "disk/run"
        if mounted:
            save(run, 1, model, opt)
            free = shutil.disk_usage(run).free
            with pytest.raises(DiskFullError) as exc:
                save(run, 2, model, opt, extra={"blob": bytes(700_000)})
            message = str(exc.value)
            # The space is back while the error is still alive: torch's writer no longer holds the deleted file.
            assert shutil.disk_usage(run).free == free
        else:
            message = run_under_file_size_limit(run, ["torch"])["torch"]
        assert message is not None and "no space left on device while writing checkpoint step-0000002" in message
        assert "The partial files were removed; the previous checkpoint and `latest` are untouched" in message
        assert_untouched(run)


def test_a_file_size_limit_during_a_save_is_reported_for_both_writers(tmp_path):
    run = tmp_path / "run"
    found = run_under_file_size_limit(run, ["torch", "safetensors"])
    for writer, message in found.items():
        assert message is not None, writer
        assert "no space left on device while writing checkpoint step-0000002" in message, message
    assert "torch's writer stopped part-way" in found["torch"]
    assert "File too large" in found["safetensors"]
    assert_untouched(run)


@contextlib.contextmanager
def without_dac_override():
    """Root writes through permission bits by CAP_DAC_OVERRIDE. Drop it from this thread's effective set for the
    block (it stays permitted, so it comes back after): the same denial an unprivileged user gets."""
    if os.geteuid() != 0:
        yield
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Sets(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, sets = Header(0x20080522, 0), (Sets * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    assert libc.capget(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())
    saved = sets[0].effective
    sets[0].effective &= ~(1 << 1)  # CAP_DAC_OVERRIDE
    assert libc.capset(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        sets[0].effective = saved
        assert libc.capset(ctypes.byref(header), sets) == 0, os.strerror(ctypes.get_errno())


@contextlib.contextmanager
def read_only(directory: Path, how: str):
    """Make `directory` unwritable, in a way that holds for root too. "mount": a read-only bind mount (EROFS)
    where this process may mount, else permission bits; "bits": mode 0555 (EACCES), with root's override dropped."""
    if how == "mount" and os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(directory), str(directory)],
                                                               check=False, capture_output=True).returncode == 0:
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(directory)], check=True, capture_output=True)
            yield
        finally:
            subprocess.run(["umount", "-l", str(directory)], check=True)
        return
    for d in (directory, directory / "checkpoints"):
        d.chmod(0o555)
    try:
        with without_dac_override():
            yield
    finally:
        for d in (directory, directory / "checkpoints"):
            d.chmod(0o755)


def test_an_output_directory_is_created_and_probed(tmp_path):
    check_writable(tmp_path / "new/run")  # created when missing, and the probe file is gone again
    assert (tmp_path / "new/run").is_dir() and not list((tmp_path / "new/run").iterdir())
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        check_writable(tmp_path / "file")


@pytest.mark.parametrize("how", ["mount", "bits"])
def test_an_unwritable_output_directory_is_reported_with_the_fix(peft, tmp_path, how):
    model, opt = peft
    run = tmp_path / "run"
    save(run, 1, model, opt)
    messages = []
    with read_only(run, how):
        for attempt in (lambda: check_writable(run), lambda: save(run, 2, model, opt)):
            with pytest.raises(OutputError) as exc:
                attempt()
            messages.append(str(exc.value))
    assert messages[0].startswith(f"cannot write the run's files to {run}: ")
    assert messages[1].startswith(f"cannot write checkpoint step-0000002 to {run / 'checkpoints'}: ")
    assert all("Set output.dir to a directory this user can write to" in m for m in messages)
    assert_untouched(run)
