"""Rollout sampling side by side (issue 30): transformers' `generate` with loraflow's sampler on the PEFT model
(`hf`), vLLM serving the LoRA adapter (`vllm-adapter`) and vLLM serving the weights with the adapter merged in
(`vllm-merged`), on one seeded Llama and one LoRA adapter, with each sync's own cost.

    python benchmarks/rollout_engine.py                  # hidden 512, 8 layers; 512 sequences x 128 new tokens
    python benchmarks/rollout_engine.py --quick          # tiny sizes, one round (a smoke run)
    python benchmarks/rollout_engine.py --json out.json

Each variant runs in its own interpreter (`--worker`), rounds interleaved (hf, vllm-adapter, vllm-merged; then the
reverse), so a slow spell of a shared machine does not land on one variant. The workload: a seeded Llama (hidden
512, 8 layers, 8 heads, MLP 1376, vocab 8192, untied head, fp32), LoRA r16 alpha 32 on every linear layer but the
head with small random B, prompts of 32 random tokens, 128 new tokens at temperature 1 with no stop token (every
completion is full length, so tokens/s counts the same work everywhere). vLLM runs from the venv
scripts/setup_vllm.sh builds (or LORAFLOW_VLLM_PYTHON), started as loraflow starts its local engine (one process,
whole prefills, prompts as token ids), and its start is reported apart from sampling.

Reported per variant: sampling tokens/s (median over rounds; requests all in flight at once for vLLM, one
`generate` call over the whole batch for hf), and for the vLLM variants the sync: the seconds to write the adapter
(or merged weights) and have the engine load it, and the bytes written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("hf", "vllm-adapter", "vllm-merged")
FULL = {"hidden": 512, "layers": 8, "heads": 8, "mlp": 1376, "vocab": 8192, "prompts": 512, "prompt_len": 32,
        "new": 128}
QUICK = {"hidden": 128, "layers": 2, "heads": 4, "mlp": 256, "vocab": 512, "prompts": 16, "prompt_len": 8, "new": 16}
"""vLLM's CPU attention needs a head dimension of 32 or more ("Unsupported CPU attention configuration: head_dim=16")."""


def build_workload(root: Path, size: dict) -> None:
    """The model, the adapter and the prompts, written once for every worker."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                         num_attention_heads=size["heads"], num_key_value_heads=size["heads"],
                         intermediate_size=size["mlp"], vocab_size=size["vocab"], max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model = LlamaForCausalLM(config)
    model.save_pretrained(root / "base")
    sys.path.insert(0, str(Path(__file__).parent))
    from peers_workload import word_tokenizer

    word_tokenizer(size["vocab"]).save_pretrained(root / "base")  # vLLM's completions API needs one
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                  "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    peft_model.save_pretrained(root / "adapter")
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, size["vocab"], (size["prompts"], size["prompt_len"]), generator=gen).tolist()
    (root / "prompts.json").write_text(json.dumps(prompts))


def worker(variant: str, root: Path, size: dict) -> dict:
    prompts = json.loads((root / "prompts.json").read_text())
    if variant == "hf":
        return hf_worker(root, prompts, size)
    return vllm_worker(variant, root, prompts, size)


def hf_worker(root: Path, prompts: list[list[int]], size: dict) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from loraflow.rl.rollout import generate

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "base"), root / "adapter").eval()
    keys = [(0, 0, i, 0) for i in range(len(prompts))]
    started = time.perf_counter()
    out = generate(model, prompts, size["prompt_len"], size["new"], [], 0, "cpu", keys, 1.0)
    seconds = time.perf_counter() - started
    return {"tokens": int(out.numel()), "seconds": seconds, "tokens_per_s": out.numel() / seconds,
            "threads": torch.get_num_threads()}


def vllm_worker(variant: str, root: Path, prompts: list[list[int]], size: dict) -> dict:
    from safetensors.torch import save_file

    from loraflow.rl.engine_rollout import merged_weights
    from loraflow.rl.vllm_server import EngineError, LocalServer, Request, ServerSettings, complete_all, tail

    adapter = variant == "vllm-adapter"
    server = LocalServer(ServerSettings(model=str(root / "base"), max_lora_rank=16,
                                        max_model_len=size["prompt_len"] + size["new"], lora=adapter),
                    root / f"{variant}.server.log")
    started = time.perf_counter()
    client = server.start()
    start_s = time.perf_counter() - started
    try:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "base"), root / "adapter")
        sync_started = time.perf_counter()  # what a sync does: write the policy, have the engine load it
        if adapter:
            peft_model.save_pretrained(root / "adapter-v1")
            client.load_adapter("policy-v1", root / "adapter-v1")
            model_name, moved = "policy-v1", (root / "adapter-v1" / "adapter_model.safetensors").stat().st_size
        else:
            weights = merged_weights(peft_model, full=False)
            target = root / "merged-v1"
            target.mkdir(exist_ok=True)
            save_file(weights, str(target / "model.safetensors"))
            client.reload_weights(target)
            model_name, moved = "base", sum(t.numel() * t.element_size() for t in weights.values())
        sync_s = time.perf_counter() - sync_started
        requests = [Request(p, 1, 1000 + i) for i, p in enumerate(prompts)]
        complete_all([client], model_name, requests[:4], size["new"], 1.0, [], concurrency=4, ignore_eos=True)
        started = time.perf_counter()
        answers = complete_all([client], model_name, requests, size["new"], 1.0, [], concurrency=len(requests),
                               ignore_eos=True)
        seconds = time.perf_counter() - started
    except EngineError as exc:
        raise EngineError(f"{exc}\nthe server's log ({server.log}) ends:\n{tail(server.log)}") from None
    finally:
        server.stop()
    tokens = sum(len(ids) for a in answers for ids, _ in a)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "start_s": start_s,
            "sync_s": sync_s, "sync_bytes": moved}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/rollout_engine.py")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.root), size)))
        return 0
    rounds = 1 if args.quick else args.rounds
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_workload(root, size)
        order = list(VARIANTS)
        for r in range(rounds):
            for variant in order if r % 2 == 0 else reversed(order):
                cmd = [sys.executable, __file__, "--worker", variant, "--root", str(root),
                       *(["--quick"] if args.quick else [])]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=dict(os.environ))
                if proc.returncode != 0:
                    print(f"{variant} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}", file=sys.stderr)
                    return 1
                results[variant].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1} {variant}: {results[variant][-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    summary = {v: {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in rows),
                   **{k: statistics.median(x[k] for x in rows) for k in ("start_s", "sync_s", "sync_bytes")
                      if k in rows[0]}} for v, rows in results.items()}
    hf = summary["hf"]["tokens_per_s"]
    print(f"\n{size['prompts']} sequences x {size['new']} new tokens, hidden {size['hidden']}, {size['layers']} layers, "
          f"fp32, {rounds} round(s); medians")
    print(f"{'variant':<14}{'tokens/s':>12}{'x hf':>8}{'start s':>10}{'sync s':>10}{'sync MB':>10}")
    for v, s in summary.items():
        print(f"{v:<14}{s['tokens_per_s']:>12,.0f}{s['tokens_per_s'] / hf:>8.2f}"
              f"{s.get('start_s', float('nan')):>10.1f}{s.get('sync_s', float('nan')):>10.3f}"
              f"{s.get('sync_bytes', float('nan')) / 1e6:>10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "rounds": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
