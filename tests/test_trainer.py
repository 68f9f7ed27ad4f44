"""The training loop end to end on the tiny model: frozen weights stay frozen while adapters learn, accumulation
is exact, a killed run resumes to the same losses, a kill during save leaves the previous checkpoint usable, and
the saved adapter loads with PEFT and merges to the same outputs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import plan_and_model, randomize_adapters
from loraflow.data import load_sft
from loraflow.errors import ConfigError
from loraflow.loop.metrics import read_metrics
from loraflow.run.train import train
from loraflow.stages.sft import loss_fn
from loraflow.loop.trainer import StageHooks, Trainer


def common(tiny_model, chat_data, run_dir, *extra):
    return [f"model.path={tiny_model}", f"data.train={chat_data[0]}", f"data.eval={chat_data[1]}",
            f"output.dir={run_dir}", "output.progress_bar=false", "output.tensorboard=false",
            "output.log_every_steps=1", "train.micro_batch_size=4", "train.learning_rate=5e-3",
            "eval.generate=false", "adapter.dropout=0.1", *extra]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}


def test_frozen_weights_stay_frozen_and_adapters_change(tiny_model, chat_data, tmp_path):
    from transformers import AutoModelForCausalLM

    summary = train("sft", None, common(tiny_model, chat_data, tmp_path / "run", "train.max_steps=4",
                                        "checkpointing.enabled=true"), None)
    assert summary["after"]["loss"] < summary["before"]["loss"]
    saved = load_file(tmp_path / "run/adapter/adapter_model.safetensors")
    assert len(saved) == 2 * 28 and all(float(t.abs().sum()) > 0 for k, t in saved.items() if "lora_B" in k)
    # base weights on disk were never touched, and the adapter file holds only adapter weights
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert all("lora_" in k for k in saved)
    assert float(base.model.layers[0].self_attn.q_proj.weight.detach().abs().sum()) > 0


def test_saved_adapter_loads_with_peft_and_merge_gives_the_same_outputs(tiny_model, chat_data, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from loraflow.commands.cli import main

    train("sft", None, common(tiny_model, chat_data, tmp_path / "run", "train.max_steps=3"), None)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "run/adapter")
    assert main(["merge", str(tmp_path / "run/adapter"), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.randint(3, 90, (2, 16))
    with torch.no_grad():
        a, b = peft_model.eval()(input_ids=ids).logits, merged.eval()(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model).eval()(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(a, plain, atol=1e-3)  # the adapter does change the outputs
    checkpoint = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                           tmp_path / "run/checkpoints/step-0000003")
    with torch.no_grad():
        assert torch.allclose(checkpoint.eval()(input_ids=ids).logits, a, atol=1e-6)


def test_accumulation_invariance(tiny_model, chat_data, tmp_path):
    """Micro-batch 1 x 4 accumulation steps == micro-batch 4 x 1: same loss, same gradients, same update."""
    lr = 1e-2
    results = []
    for mbs, accum in ((1, 4), (4, 1)):
        plan, model, tokenizer = plan_and_model(tiny_model, f"train.micro_batch_size={mbs}",
                                                f"train.gradient_accumulation_steps={accum}", "train.max_steps=1",
                                                f"train.learning_rate={lr}", "adapter.method=dora", data=chat_data)
        randomize_adapters(model)
        split, _ = load_sft(plan.config, tokenizer)
        trainer = Trainer(plan, model, tokenizer, split, StageHooks(loss_fn(plan)), tmp_path / f"r{mbs}")
        loss = trainer.accumulate()["loss"]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        trainer.apply_update()
        params = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((loss, grads, params))
    (loss_a, grads_a, params_a), (loss_b, grads_b, params_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    worst = max(float((grads_a[n] - grads_b[n]).norm() / grads_b[n].norm()) for n in grads_a)
    assert worst < 1e-5, f"relative gradient difference {worst:.1e}"
    # Adam's first step moves each weight by about lr * g / (|g| + eps): where g is near zero, float summation
    # order shows up at about 1e-4 of the step, so the update is compared relative to the learning rate.
    assert all(torch.allclose(params_a[n], params_b[n], rtol=0, atol=1e-3 * lr) for n in params_a)


KILLER = textwrap.dedent("""
    import os, signal, sys
    import loraflow.checkpoints.store as ck
    import loraflow.loop.trainer as tr
    import torch
    mode, step = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(int(sys.argv[3]))  # as many as the comparison run: float sums depend on it
    real_save = ck.save_checkpoint
    def save_then_die(run_dir, s, *a, **k):
        if mode == "after-save":
            out = real_save(run_dir, s, *a, **k)
            if s == step:
                os.kill(os.getpid(), signal.SIGKILL)  # a real, uncatchable death right after step k
            return out
        if s == step:  # die in the middle of writing: weights written, trainer state half written
            real_torch_save = ck.torch.save
            def half(obj, path):
                with open(path, "wb") as fh:
                    fh.write(b"partial")
                    fh.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            ck.torch.save = half
        return real_save(run_dir, s, *a, **k)
    tr.save_checkpoint = save_then_die
    from loraflow.run.train import train
    train("sft", None, sys.argv[4:], None)
""")


def run_and_kill(mode: str, step: int, overrides: list[str]) -> int:
    proc = subprocess.run([sys.executable, "-c", KILLER, mode, str(step), str(torch.get_num_threads()), *overrides],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode


def test_resume_after_a_kill_gives_the_same_losses(tiny_model, chat_data, tmp_path):
    extra = ["train.max_steps=8", "output.save_every_steps=3"]
    full = train("sft", None, common(tiny_model, chat_data, tmp_path / "full", *extra), None)
    assert full["steps"] == 8
    killed = tmp_path / "killed"
    assert run_and_kill("after-save", 3, common(tiny_model, chat_data, killed, *extra)) == -9
    assert train_losses(killed).keys() == {1, 2, 3}
    resumed = train("sft", None, ["output.progress_bar=false"], str(killed))
    assert resumed["steps"] == 8
    assert [r["step"] for r in read_metrics(killed, "train")] == list(range(1, 9))
    assert train_losses(killed) == pytest.approx(train_losses(tmp_path / "full"), rel=1e-6)
    assert load_file(killed / "adapter/adapter_model.safetensors").keys() == \
        load_file(tmp_path / "full/adapter/adapter_model.safetensors").keys()


def test_kill_during_save_leaves_the_previous_checkpoint_usable(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    extra = ["train.max_steps=8", "output.save_every_steps=3"]
    assert run_and_kill("during-save", 6, common(tiny_model, chat_data, run, *extra)) == -9
    assert (run / "latest").read_text().strip() == "step-0000003"
    assert [p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith(".")] == ["step-0000003"]
    assert any(p.name.startswith(".tmp-step-0000006") for p in (run / "checkpoints").iterdir())
    assert train_losses(run).keys() == set(range(1, 7))
    summary = train("sft", None, ["output.progress_bar=false"], str(run))
    assert summary["steps"] == 8
    assert not any(p.name.startswith(".tmp") for p in (run / "checkpoints").iterdir())
    # Steps 4-6 were replayed from the step-3 checkpoint; their first rows were dropped, so each appears once.
    assert [r["step"] for r in read_metrics(run, "train")] == list(range(1, 9))


def test_resume_without_checkpoint_and_reused_directory(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=1"), None)
    with pytest.raises(ConfigError, match="already holds a run"):
        train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=1"), None)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/config.yaml").write_text((run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match="--restart"):
        train("sft", None, [], str(tmp_path / "empty"))


def test_resume_refuses_changes_that_would_break_it(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=2", "output.save_every_steps=1"), None)
    with pytest.raises(ConfigError) as exc:
        train("sft", None, ["train.learning_rate=1e-5", "adapter.rank=4", "train.max_steps=3"], str(run))
    # The schedule's keys first (each with the ways forward: tests/run/test_resume_schedule.py), then the others.
    assert [p.split("=")[0] for p in exc.value.problems] == ["train.max_steps", "train.learning_rate",
                                                              "adapter.rank"]
    summary = train("sft", None, ["train.max_steps=3", "output.progress_bar=false"], str(run), extend=True)
    assert summary["steps"] == 3


def test_a_run_that_fails_before_training_leaves_the_directory_reusable(tiny_model, chat_data, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="contradicts"):
        train("sft", None, common(tiny_model, chat_data, run, "model.dtype=bfloat16"), None)
    assert not (run / "config.yaml").exists()
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=1"), None)


def test_a_checkpoint_missing_a_listed_file_is_not_used(tiny_model, chat_data, tmp_path):
    from loraflow.checkpoints.store import latest_checkpoint

    run = tmp_path / "run"
    train("sft", None, common(tiny_model, chat_data, run, "train.max_steps=4", "output.save_every_steps=2",
                              "output.keep_checkpoints=3"), None)
    assert latest_checkpoint(run).name == "step-0000004"
    (run / "checkpoints/step-0000004/trainer_state.pt").unlink()
    assert latest_checkpoint(run).name == "step-0000002"
