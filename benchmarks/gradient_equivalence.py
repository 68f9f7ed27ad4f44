"""Print the gradient-equivalence table: for each adapter method and checkpointing setting, the largest relative
error of one step's trainable gradients against the no-checkpointing fp32 reference (the same computation the
tests assert, printed with its figures). Adapter dropout is on and the model config keeps use_cache=True.

    python benchmarks/gradient_equivalence.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import build_tiny_model, reverse_records, write_jsonl  # noqa: E402
from test_gradients import CHECKPOINTING, METHODS, one_step_gradients  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model")
        data = (write_jsonl(root / "train.jsonl", reverse_records(48, 0)),
                write_jsonl(root / "eval.jsonl", reverse_records(8, 1)))
        print(f"{'method':<6} {'checkpointing':<22} {'hook':<5} {'rel. loss err':>13} {'max rel. grad err':>18}")
        for method, method_overrides in METHODS.items():
            _, ref_loss, ref = one_step_gradients(model, data, method_overrides)
            for name, overrides in CHECKPOINTING.items():
                plan, loss, grads = one_step_gradients(model, data, method_overrides + overrides)
                err = max(float((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref)
                print(f"{method:<6} {name:<22} {str(plan.input_grad_hook):<5} "
                      f"{abs(loss - ref_loss) / abs(ref_loss):>13.1e} {err:>18.1e}")


if __name__ == "__main__":
    main()
