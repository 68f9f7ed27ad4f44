"""Activation memory options beyond on/off (issue 17, part 3): sub-block checkpointing (checkpointing.granularity),
a number of layers spread evenly (checkpointing.layers) and activation offload each give the no-checkpointing
fp32 loss and adapter gradients of one step, run through the trainer `train` builds; and the per-layer count of
bytes saved for backward sits at the full-recompute floor when every layer recomputes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import make_config, randomize_adapters

from loraflow.environment import detect_environment
from loraflow.run.pipeline import build_run
from loraflow.setup.checkpointing import (
    CHECKPOINTED,
    checkpointed_blocks,
    decoder_layers,
)
from loraflow.locations import ASSETS
from loraflow.setup.saved_tensors import ActivationSaving

ON = "checkpointing.enabled=true"
MODES = {
    "mlp": [ON, "checkpointing.granularity=mlp"],
    "mlp-reentrant": [ON, "checkpointing.granularity=mlp", "checkpointing.reentrant=true"],
    "attention": [ON, "checkpointing.granularity=attention"],
    "attention-reentrant": [ON, "checkpointing.granularity=attention", "checkpointing.reentrant=true"],
    "layers3": [ON, "checkpointing.layers=3"],
    "layers2-reentrant": [ON, "checkpointing.layers=2", "checkpointing.reentrant=true"],
    "mlp-layers2": [ON, "checkpointing.granularity=mlp", "checkpointing.layers=2"],
}
EXPECTED_BLOCKS = {  # what each mode leaves checkpointed on the 4-layer model: (layer, block)
    "mlp": [(i, "mlp") for i in range(4)], "mlp-reentrant": [(i, "mlp") for i in range(4)],
    "attention": [(i, "self_attn") for i in range(4)], "attention-reentrant": [(i, "self_attn") for i in range(4)],
    "layers3": [(0, "layer"), (1, "layer"), (2, "layer")], "layers2-reentrant": [(0, "layer"), (2, "layer")],
    "mlp-layers2": [(0, "mlp"), (2, "mlp")],
}


def one_step(model: Path, data, overrides: list[str], tmp: Path, offload: bool | None = None, count: bool = True):
    """(trainer, loss, adapter gradients) after the forward and backward of one step, as `train` runs them."""
    config = make_config(model, "adapter.dropout=0.1", "train.micro_batch_size=4", f"output.dir={tmp}",
                         *overrides, data=data)
    run = build_run(config, detect_environment(), tmp, adjust_model=randomize_adapters)
    if offload is not None or not count:
        run.trainer.activations = ActivationSaving(run.plan, run.trainer.engine.module, count, offload)
    stats = run.trainer.accumulate()
    return run.trainer, stats["loss"], run.trainer.engine.full_grads()


@pytest.fixture(scope="module")
def reference(tiny_model, chat_data, tmp_path_factory):
    return one_step(tiny_model, chat_data, [], tmp_path_factory.mktemp("reference"))


def assert_same_step(got, want) -> None:
    (_, loss, grads), (_, ref_loss, ref) = got, want
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert grads.keys() == ref.keys() and sum("lora_B" in n for n in grads) == 28
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing[:3]}"
    worst = max(float((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref)
    assert worst <= 1e-6, f"max relative gradient error {worst:.2e}"


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_gives_the_reference_step(mode, tiny_model, chat_data, reference, tmp_path):
    got = one_step(tiny_model, chat_data, MODES[mode], tmp_path)
    trainer = got[0]
    assert [b for b in checkpointed_blocks(trainer.model) if b[1]] == EXPECTED_BLOCKS[mode]
    assert_same_step(got, reference)


@pytest.mark.parametrize("overrides", [[], MODES["mlp"]], ids=["no-checkpointing", "mlp"])
def test_activation_offload_gives_the_reference_step(overrides, tiny_model, chat_data, reference, tmp_path):
    """The plan turns offload off on a CPU device; the round trip (copy out at save, back at backward) is forced
    on here so it runs."""
    got = one_step(tiny_model, chat_data, ["checkpointing.offload_activations=true", *overrides], tmp_path,
                   offload=True)
    assert got[0].plan.offload_activations is False  # no effect on cpu, as the plan says
    assert got[0].activations.offloaded > 20
    assert_same_step(got, reference)


def test_sub_block_checkpoint_keeps_parameter_names(tiny_model, chat_data, tmp_path):
    """torch's checkpoint goes around the child's forward in place: no wrapper module renames the adapters."""
    trainer, _, grads = one_step(tiny_model, chat_data, MODES["mlp"], tmp_path)
    assert all(".mlp." in n or ".self_attn." in n for n in grads if "lora" in n)
    assert sum(getattr(m, CHECKPOINTED, False) for m in trainer.model.modules()) == 4


# -- bytes saved for backward --------------------------------------------------------------------------------------

@pytest.mark.parametrize("reentrant", ["false", "true"])
@pytest.mark.parametrize("which", ["builtin:tiny-base", "llama-from-config"])
def test_full_checkpointing_saves_the_floor_per_layer(which, reentrant, tiny_model, chat_data, tmp_path):
    model = ASSETS / "tiny-base" if which == "builtin:tiny-base" else tiny_model
    counts = {}
    for name, extra in {"off": [], "layer": [ON, f"checkpointing.reentrant={reentrant}"],
                        "mlp": [*MODES["mlp"], f"checkpointing.reentrant={reentrant}"],
                        "attention": [*MODES["attention"], f"checkpointing.reentrant={reentrant}"]}.items():
        trainer, _, _ = one_step(model, chat_data, extra, tmp_path / name)
        counts[name] = trainer.activations.counted
    full, off = counts["layer"], counts["off"]
    assert full.dtype == "float32" and len(full.shape) == 3 and full.floor[0] == 4 * full.shape[0] * \
        full.shape[1] * full.shape[2]
    assert max(full.ratios()) <= 1.15, full.render()
    assert min(full.ratios()) >= 0.99, full.render()  # the layer input is really kept: counted, not missed
    assert min(off.ratios()) > 5, off.render()  # without recompute a layer keeps many times its input
    for partial in (counts["mlp"], counts["attention"]):  # in between: one sub-block's tensors are still kept
        assert all(f < p < o for f, p, o in zip(full.per_layer, partial.per_layer, off.per_layer)), partial.render()
    text = "\n".join(full.render())
    assert "floor = float32 (4 B)" in text and "saved / floor" in text


def test_counting_leaves_the_step_unchanged(tiny_model, chat_data, reference, tmp_path):
    """The reference step is counted (the first forward of its run); the same step uncounted is bit-identical."""
    trainer, loss, grads = one_step(tiny_model, chat_data, [], tmp_path, count=False)
    assert trainer.activations.counted is None and reference[0].activations.counted is not None
    assert loss == reference[1] and all(torch.equal(g, reference[2][n]) for n, g in grads.items())


def test_counting_runs_on_the_first_forward_only(tiny_model, chat_data, tmp_path):
    trainer, _, _ = one_step(tiny_model, chat_data, [ON], tmp_path)
    first = trainer.activations.counted
    hooks = [len(m._forward_pre_hooks) + len(m._forward_hooks) for m in decoder_layers(trainer.model)]
    trainer.engine.step()
    trainer.accumulate()
    assert trainer.activations.counted is first and not trainer.activations.count_next
    assert hooks == [0] * 4  # the counter's hooks are gone once the counted forward ends


def test_memory_report_prints_the_activation_table(tiny_model, chat_data, tmp_path):
    """The first optimizer step (the one `train` checks) fills the memory report's activation lines and metrics."""
    from loraflow.loop.guards import FrozenWeights

    config = make_config(tiny_model, ON, "checkpointing.granularity=attention", f"output.dir={tmp_path}",
                         data=chat_data)
    trainer = build_run(config, detect_environment(), tmp_path).trainer
    trainer.optimizer_step(FrozenWeights(trainer.model, trainer.engine.local_tensor))
    text = trainer.memory.render()
    assert "bytes saved for backward per decoder layer" in text and "self_attn" in text
    assert "outside layers" in text
    metrics = trainer.memory.to_metrics()
    assert metrics["layer0_saved_bytes"] > metrics["layer0_floor_bytes"] > 0


def test_verify_compares_blocks_with_the_plan(tiny_model, chat_data):
    """After applying, what recomputes must equal the plan, sub-block included."""
    from conftest import plan_and_model

    from loraflow.errors import LoraflowError
    from loraflow.setup.checkpointing import _verify

    plan, model, _ = plan_and_model(tiny_model, *MODES["mlp-layers2"], data=chat_data)
    _verify(model, plan)
    other = dataclasses.replace(plan, checkpoint_block="self_attn")  # the plan is frozen: a changed copy
    with pytest.raises(LoraflowError, match=r"the plan says \[\(0, 'self_attn'\).*checkpointing.granularity=layer"):
        _verify(model, other)
