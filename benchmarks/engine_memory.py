"""Per-rank memory of each engine after the first step, against the formula for adapters under full sharding,
(b x base params + 16 x adapter params) / world size (b = 2 for bf16 base weights; 16 = fp32 weight, gradient and
two Adam moments). The figures are byte counts of the tensors each rank holds (loop/memory.py), so they do not
depend on the machine.

    python benchmarks/engine_memory.py                 # a 8-layer, 512-wide Llama built from a config, bf16-mixed
    python benchmarks/engine_memory.py --layers 4 --hidden 256 --precision fp32

Each engine runs `loraflow train sft` for one step under `torchrun --nproc_per_node 2` (gloo, CPU) and the report
it writes to metrics.jsonl is read back.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZERO3_JSON = ROOT / "examples" / "deepspeed" / "zero3-shard-small-models.json"
ENGINES = {
    "ddp": ["parallel.engine=ddp"],
    "zero2": ["parallel.engine=deepspeed", "parallel.zero_stage=2"],
    "zero3": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}"],
    "zero3-offload": ["parallel.engine=deepspeed", f"parallel.deepspeed_config={ZERO3_JSON}",
                      "parallel.offload_optimizer=true", "parallel.offload_params=true"],
    "fsdp2": ["parallel.engine=fsdp2"],
}
MiB = 2**20


def build_model(path: Path, layers: int, hidden: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from loraflow.locations import ASSETS

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 128), max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(ASSETS / "tiny-base" / name, path / name)


def main() -> int:
    from loraflow.engines.launch import launch_env, run_isolated, torchrun_argv
    from loraflow.loop.metrics import read_metrics

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--precision", default="bf16-mixed", choices=["fp32", "bf16-mixed"])
    p.add_argument("--engines", default=",".join(ENGINES))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model, args.layers, args.hidden)
        for engine in args.engines.split(","):
            run = Path(tmp) / engine
            print(f"running {engine} ...", file=sys.stderr, flush=True)
            argv = torchrun_argv(2, ["-m", "loraflow", "train", "sft", f"model.path={model}", "train.max_steps=1",
                                     "train.micro_batch_size=2", "data.eval=", f"precision.mode={args.precision}",
                                     "output.progress_bar=false", "output.tensorboard=false", f"output.dir={run}",
                                     *ENGINES[engine]])
            log = Path(tmp) / f"{engine}.log"
            code = run_isolated(argv, log, 600, launch_env())
            if code != 0:
                print(f"{engine}: exit {code}\n{log.read_text()[-3000:]}", file=sys.stderr)
                return 1
            rows.append((engine, read_metrics(run, "memory")[0]))
    first = rows[0][1]
    print(f"Llama {args.layers} layers x {args.hidden} wide, LoRA r=8 on all linear layers, {args.precision}, "
          f"2 processes: {first['base_elements']:,} frozen and {first['adapter_elements']:,} trainable elements")
    print(f"{'engine':<14} {'frozen':>9} {'trainable':>9} {'grads':>9} {'optimizer':>9} {'total':>9} "
          f"{'formula':>9} {'total/formula':>13}   (MiB, rank 0)")
    for engine, m in rows:
        print(f"{engine:<14} " + " ".join(f"{m[f'rank0_{k}_bytes'] / MiB:>9.2f}" for k in
                                           ("frozen_params", "trainable_params", "gradients", "optimizer", "total"))
              + f" {m['formula_bytes'] / MiB:>9.2f} {m['rank0_total_bytes'] / m['formula_bytes']:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
