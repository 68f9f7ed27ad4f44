"""Every stage's loss and gradients are unchanged by the head at learned positions only (chunked), and by packing
preference pairs: one step of each stage's embedded default, fp32, against the full computation."""

from __future__ import annotations

import pytest
import torch

from conftest import randomize_adapters
from loraflow.config import load_config
from loraflow.environment import detect_environment
from loraflow.run.pipeline import build_run
from loraflow.run.config import demo_config


def one_step(stage: str, overrides: list[str], tmp_path) -> tuple[float, dict[str, torch.Tensor], object]:
    config = load_config(str(demo_config(stage)), [f"stage={stage}", "data.eval=", "output.progress_bar=false",
                                                   "output.tensorboard=false", f"output.dir={tmp_path}",
                                                   "train.micro_batch_size=4", *overrides])
    run = build_run(config, detect_environment(), tmp_path)
    trainer = run.trainer
    randomize_adapters(trainer.model)  # LoRA's B = 0 start would leave A's gradients zero on both sides
    stats = trainer.accumulate()
    first_batch = trainer.prepared[0][0][0]
    return stats["loss"], trainer.engine.full_grads(), run.plan, first_batch


def assert_same(a, b, tolerance: float = 1e-5) -> None:
    """Same loss, and every gradient element within `tolerance` of its tensor's largest element."""
    loss_a, grads_a = a[:2]
    loss_b, grads_b = b[:2]
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert grads_a.keys() == grads_b.keys()
    compared = 0
    for name, g in grads_a.items():
        if g is None:
            assert grads_b[name] is None, name
            continue
        scale = float(grads_b[name].abs().max())
        assert float((g - grads_b[name]).abs().max()) <= tolerance * max(scale, 1e-12), name
        compared += scale > 0
    assert compared > 0


@pytest.mark.parametrize("stage", ["sft", "dpo", "grpo", "ppo"])
def test_learned_positions_equal_full_logits(stage, tmp_path):
    full = one_step(stage, ["train.logits=full"], tmp_path / "full")
    # A budget of a few KiB: chunks of a handful of positions, so chunk boundaries are exercised.
    learned = one_step(stage, ["train.logits=learned", "train.logits_chunk_mib=0.002"], tmp_path / "learned")
    assert not full[2].logits.selected and learned[2].logits.selected
    assert 0 < learned[2].logits.chunk_tokens < 16
    assert_same(learned, full)


@pytest.mark.parametrize("stage, extra", [("dpo", []), ("dpo", ["dpo.loss=ipo"]), ("rm", [])])
def test_packed_pairs_equal_unpacked(stage, extra, tmp_path):
    extra = ["data.max_length=256", *extra]  # room for several answers per packed row
    unpacked = one_step(stage, extra, tmp_path / "rows")
    packed = one_step(stage, ["data.packing=true", *extra], tmp_path / "packed")
    assert "segments" in packed[3] and "segments" not in unpacked[3]
    # 4 pairs are 8 answers: packing puts several in one row
    assert packed[3]["input_ids"].shape[0] < unpacked[3]["input_ids"].shape[0] == 8
    # 1e-4: a pair loss's gradient is the difference of the chosen and rejected answers' gradients, which cancel, so
    # the rounding of packed rows' differently shaped matmuls and masked attention shows larger than in SFT: up to
    # 2.1e-5 of the largest element for DPO on an AMD EPYC (2026-11-26; 7e-6 on the machine that wrote this test).
    # 1e-4 leaves a margin of 5 over that rounding; a token attending to another answer is not rounding.
    assert_same(packed, unpacked, tolerance=1e-4)


def test_packed_pairs_share_rows_and_never_attend_across():
    """The packed batch really holds several answers per row, each with its own positions and segment."""
    from loraflow.data.batching import Row
    from loraflow.data.preference import PairRow, collate_pairs, sequence_ends

    pairs = [PairRow(Row([5, 6, 7], [-100, 6, 7]), Row([5, 6, 8, 9], [-100, 6, 8, 9]), f"p{i}") for i in range(3)]
    batch = collate_pairs(pairs, pad_id=0, pack_to=8)
    assert batch["input_ids"].shape[0] < 6  # fewer rows than answers
    assert "attention_mask" not in batch and "position_ids" in batch
    ends = sequence_ends(batch["segments"], 6)
    flat_ids = batch["input_ids"].reshape(-1)
    assert flat_ids[ends].tolist() == [7, 7, 7, 9, 9, 9]  # chosen answers end in 7, rejected in 9
    positions = batch["position_ids"].reshape(-1)[ends].tolist()
    assert positions == [2, 2, 2, 3, 3, 3]  # each answer counts its own positions from 0
