"""Image-text models under every engine: two gloo ranks under torchrun, through the path `loraflow train` takes
(verify/crosscheck.py), against the single-process fp32 reference without checkpointing. Every tower checkpointed
(reentrant or not), in MiniCPM-V's setup (LoRA on the language model, the vision encoder and projector trained in
full) and with adapters in the vision encoder too; half the samples are text-only, so some ranks' micro-batches
hold no image and get the blank one. One step's gathered gradients match within 1e-5, three steps give the same
losses and weights, and the saved adapter holds every trained tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LAUNCH_TIMEOUT
import torch
from image_text import build_image_text, write_colour_data

from loraflow.engines.launch import launch_env, run_isolated
from loraflow.verify.crosscheck import Cell, compare, worker_argv

TOLERANCE = 1e-5
ENGINES = ("ddp", "zero2", "zero3", "zero3-offload", "fsdp2")
# family -> its cells: LLaVA under every engine, both tower setups, both recompute modes; Idefics3 (another
# vision encoder, connector and image layout) on the two sharding engines.
CELLS = {
    "llava": [Cell("lora", ckpt, "fp32", engine, towers=towers) for engine in ENGINES
              for ckpt, towers in (("non-reentrant", "minicpm"), ("reentrant", "vision"))],
    "idefics3": [Cell("lora", "non-reentrant", "fp32", engine, towers="minicpm") for engine in ("zero3", "fsdp2")],
}


def _worker(tmp: Path, model: Path, data: Path, cells: list[Cell], ranks: int) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    argv, out = worker_argv(cells, str(model), str(data), tmp, "worker", ranks, reference=ranks == 1)
    log = tmp / "worker.log"
    code = run_isolated(argv, log, LAUNCH_TIMEOUT, launch_env())
    assert code == 0, f"worker exited with {code}:\n{log.read_text()[-4000:]}"
    return torch.load(out, weights_only=False)["results"]


@pytest.mark.parametrize("family", list(CELLS))
def test_image_text_engines_match_the_single_process_reference(family, tmp_path):
    model = build_image_text(tmp_path / family, family)
    data = write_colour_data(tmp_path / "data", 12, 0, text_only_every=2)
    cells = CELLS[family]
    references = _worker(tmp_path / "reference", model, data, cells, 1)
    results = _worker(tmp_path / "engines", model, data, cells, 2)
    lines, bad, blanks = [], [], 0
    for cell in cells:
        r = compare(results[cell.id], references[cell.reference().id])
        if r["status"] != "ok":
            bad.append(f"{cell.id}: {r['status']} {r.get('message', '')[:300]}")
            continue
        got = results[cell.id]
        blanks += got["blank_batches"]
        lines.append(f"{cell.id}: gradient {r['grad_error']:.1e} (worst {r['worst']}), losses {r['loss_error']:.1e}, "
                     f"weights {r['weight_error']:.1e}, blank batches {got['blank_batches']}, null gradients "
                     f"{len(r['null_gradients'])}")
        if r["grad_error"] > TOLERANCE or r["loss_error"] > TOLERANCE or r["weight_error"] > 1e-3:
            bad.append(lines[-1])
        if got["saved_tensors"] != len(got["final"]):
            bad.append(f"{cell.id}: the saved adapter holds {got['saved_tensors']} of {len(got['final'])} tensors")
        # The towers trained: the vision encoder's weights (in full or adapted) are among the compared ones.
        if not any("vision" in name for name in got["final"]):
            bad.append(f"{cell.id}: no vision-encoder weight trained")
    print("\n".join(lines))
    assert not bad, "\n".join(bad)
    assert blanks > 0, "no micro-batch went without an image: the blank image path was not exercised"
