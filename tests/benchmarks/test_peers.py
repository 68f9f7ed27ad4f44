"""benchmarks/peers.py: the three variants (plain PyTorch, TRL, loraflow) run the same first batch from the same
adapter, and the figures it prints are the ones it writes. Nothing here is about speed.

The run is the peers step of the device check's CPU rehearsal (the session fixture `gpu_check_quick`): the gpu-1b
preset's structure (grouped-query attention, tied embeddings) at toy size, bf16-mixed, checkpointing on, so the
path a GPU takes is the one tested here."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "peers.py"
VARIANTS = ("plain", "trl", "loraflow")


def _peers_module():
    spec = importlib.util.spec_from_file_location("peers_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(gpu_check_quick):
    _, summary = gpu_check_quick
    out = Path(summary["out"])
    report = json.loads((out / "peers.bench.json").read_text())
    return report, (out / "peers.bench.log").read_text()


def test_every_variant_runs_the_same_first_batch_from_the_same_adapter(smoke):
    report, _ = smoke
    assert report["precision"] == "bf16-mixed" and not report.get("partial")
    assert report["model"]["num_key_value_heads"] < report["model"]["num_attention_heads"]  # the preset's structure
    assert report["cells"]
    limit = _peers_module().FIRST_LOSS_AGREEMENT["bf16-mixed"]
    for name, cell in report["cells"].items():
        for v in VARIANTS:
            assert "error" not in cell[v], f"{name} {v}: {cell[v].get('error')}\n{cell[v].get('stderr_tail')}"
        hashes = {v: cell[v]["first_batch_hash"] for v in VARIANTS}
        assert len(set(hashes.values())) == 1 and None not in hashes.values(), (name, hashes)
        losses = [cell[v]["first_loss"] for v in VARIANTS]
        assert max(losses) - min(losses) <= limit * abs(losses[0]), (name, losses)
        assert cell["problems"] == []


def test_figures_are_positive_and_the_printed_ratios_are_the_json_ones(smoke):
    report, stdout = smoke
    assert report["matmul_flops_per_s"] > 0 and report["floor"]["total"] > 0
    sections = re.split(r"^== (\S+) ==$", stdout, flags=re.MULTILINE)
    printed = dict(zip(sections[1::2], sections[2::2]))
    assert set(printed) == set(report["cells"])
    for name, cell in report["cells"].items():
        seq, batch = cell["shape"]["seq"], cell["shape"]["batch"]
        for v in VARIANTS:
            r = cell[v]
            for key in ("flops", "saved_bytes", "peak_rss_mb", "median_s", "tokens_per_s"):
                assert isinstance(r[key], (int, float)) and r[key] > 0, (name, v, key, r[key])
            assert len(r["step_times"]) == report["steps"] - 1  # the first step is warm-up
            assert r["tokens_per_s"] == pytest.approx(seq * batch / r["median_s"])
        for other in ("plain", "trl"):
            ratio = cell["ratios"][f"loraflow/{other}"]
            for key in ("median_s", "flops", "peak_rss_mb", "saved_bytes"):
                assert ratio[key] == pytest.approx(cell["loraflow"][key] / cell[other][key])
            line = re.search(rf"^loraflow/{other}\s+time (\S+)\s+FLOPs (\S+)\s+RSS (\S+)\s+saved (\S+)$",
                             printed[name], flags=re.MULTILINE)
            assert line, printed[name]
            shown = [float(x) for x in line.groups()]
            assert shown == [round(ratio[k], 2) for k in ("median_s", "flops", "peak_rss_mb", "saved_bytes")]


def test_the_comparability_check_catches_a_different_batch_or_start():
    peers = _peers_module()
    same = {v: {"hashes": ["abc"], "first_loss": 6.9} for v in VARIANTS}
    assert peers.check_identical(same) == []
    other_batch = {**same, "trl": {"hashes": ["abd"], "first_loss": 6.9}}
    assert "first batches differ" in peers.check_identical(other_batch)[0]
    other_start = {**same, "loraflow": {"hashes": ["abc"], "first_loss": 6.9 * (1 + 3e-4)}}
    assert "first losses differ" in peers.check_identical(other_start)[0]
    assert peers.check_identical(other_start, "bf16-mixed") == []  # bf16's kernels round differently
    apart = {**same, "loraflow": {"hashes": ["abc"], "first_loss": 6.9 * (1 + 5e-3)}}
    assert "first losses differ" in peers.check_identical(apart, "bf16-mixed")[0]


def test_the_figures_of_a_gpu_run_follow_their_formulas():
    """MFU's numerator and the floor on Llama-3.2-1B's shape (grouped-query attention: k and v are a quarter of q)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers_figures import LLAMA_1B, decoder_linears, model_flops, nominal_peak

    weights, dims = decoder_linears(LLAMA_1B)
    assert dims[1] == (2048, 512) and weights == 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
    n = 16 * weights + 2048 * 128256  # the decoder's linears and the head (tied to the embedding, but it multiplies)
    assert 1.23e9 < n < 1.24e9
    attention = 3 * 2 * 2048**2 * 2048 * 16 * 4
    assert model_flops(LLAMA_1B, 2048, 4, recompute=False) == 4 * n * 2048 * 4 + attention
    assert model_flops(LLAMA_1B, 2048, 4, recompute=True) == 6 * n * 2048 * 4 + attention * 4 // 3
    assert nominal_peak("NVIDIA H100 80GB HBM3") == 989.4e12 and nominal_peak("NVIDIA H100 PCIe") == 756e12
    assert nominal_peak("NVIDIA H200") == 989.4e12 and nominal_peak("Tesla T4") is None


def test_grouped_query_attention_is_counted_as_its_repeated_heads():
    """On CUDA transformers hands SDPA keys and values with fewer heads than the queries (enable_gqa); torch before
    2.13 refuses to count that, which failed every variant of the first H200 run. The benchmark's counter must give
    the FLOPs of the same attention with keys and values repeated to the query heads, forward and backward."""
    import sys

    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers_workload import flop_counter

    q = torch.randn(2, 8, 16, 32, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 32, requires_grad=True) for _ in range(2))

    def count(grouped: bool) -> int:
        with flop_counter() as counter:
            if grouped:
                out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            else:
                out = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
            out.sum().backward()
        return counter.get_total_flops()

    # 2 x (b h s s d) for each of the forward's two matmuls and the backward's five (b=2 h=8 s=16 d=32)
    assert count(grouped=True) == count(grouped=False) == 2 * 2 * 8 * 16 * 16 * 32 * (2 + 5)


def test_matmuls_with_an_output_dtype_are_counted():
    """TRL's chunked log-probabilities call torch.addmm(..., out_dtype=torch.float32) on CUDA; torch's own formulas
    fail on that overload ("addmm_flop() got multiple values for argument 'out_shape'"), which failed TRL's variant
    of the second H200 run. Meta tensors run the overload's shapes on the CPU, which has no kernel for it."""
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers_workload import flop_counter

    a = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    b = torch.empty(8, 3, dtype=torch.bfloat16, device="meta")
    acc = torch.empty(4, 3, device="meta")
    with flop_counter() as counter:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        torch.bmm(a[None], b[None], out_dtype=torch.float32)
        torch.mm(a, b, out_dtype=torch.float32)
        torch.addmm(acc, a.float(), b.float())
    assert counter.get_total_flops() == 4 * (2 * 4 * 8 * 3)
