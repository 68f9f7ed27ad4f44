"""Build the trained assets the RL demos start from, with loraflow itself (seeded; about four minutes on 2 cores):

- assets/reverse-sft-weak: a LoRA adapter from a short SFT run of the reversal task (30 steps), which answers
  some held-out words right and many wrong. GRPO and PPO start from it (model.merge_adapters), so their demos
  show reinforcement learning improving a policy that is partly there, as in the usual SFT -> RL pipeline.
- assets/reverse-rm: the reward model the PPO demo uses (rl.reward_model). As in InstructGPT, its comparisons are
  between the policy's own samples: for every training word, the correct reversal and 8 samples of the weak SFT
  policy, ranked by the verifiable partial reward standing in for the labeller (up to 10 pairs per word, written
  to a temporary file with the shipped pairs, not shipped). Earlier reward models compared the correct answer
  with hand-made or sampled mistakes only; they never learnt which of two wrong answers is nearer, and PPO
  exploited them (exact match fell while their score rose).

Run: python scripts/build_rl_assets.py [--only rm]   (after scripts/build_rl_data.py; it rewrites both
directories, or only the reward model from the shipped SFT adapter, and records the files' sha256 in each
BUILD.json).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "src" / "loraflow" / "assets"
SFT_STEPS = 30
RM_STEPS = 1500


def train(stage: str, run_dir: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "loraflow", "train", stage, f"output.dir={run_dir}", "output.progress_bar=false",
           "output.tensorboard=false", *overrides]
    subprocess.run(cmd, check=True)
    return json.loads((run_dir / "summary.json").read_text())


def ranked_pairs(adapter: Path, directory: Path, samples: int = 8, per_word: int = 10) -> Path:
    """Comparisons between the weak SFT policy's samples (and the correct answer) for every training word, the
    higher reverse_partial reward preferred; ties give no pair."""
    import random

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loraflow.rl.rewards import reverse_partial
    from loraflow.rl.rollout import decode, generate, stop_ids

    base = ASSETS / "tiny-base"
    tok = AutoTokenizer.from_pretrained(base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload().eval()
    records = [json.loads(line) for line in (ASSETS / "reverse" / "prompts-train.jsonl").read_text().splitlines()]
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True) for r in records]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    width, stop = max(map(len, prompts)), stop_ids(model, tok)
    candidates: list[set[str]] = [{r["answer"]} for r in records]
    with torch.no_grad():
        for start in range(0, len(records), 100):
            chunk = range(start, min(start + 100, len(records)))
            rows = [i for i in chunk for _ in range(samples)]
            keys = [(7, 0, i, k) for i in chunk for k in range(samples)]  # keyed sampling: reproducible
            texts = decode(tok, generate(model, [prompts[i] for i in rows], width, 16, stop, tok.pad_token_id,
                                         "cpu", keys, 1.0), stop)
            for i, text in zip(rows, texts):
                if text:
                    candidates[i].add(text)
    rng, out = random.Random(0), []
    for record, found in zip(records, candidates):
        texts = sorted(found)
        score = dict(zip(texts, reverse_partial(texts, [record] * len(texts))))
        pairs = [(a, b) for a in texts for b in texts if score[a] > score[b]]
        rng.shuffle(pairs)
        out += [{"prompt": record["prompt"], "chosen": a, "rejected": b} for a, b in pairs[:per_word]]
    path = directory / "prefs-ranked.jsonl"
    shipped = (ASSETS / "reverse" / "prefs-train.jsonl").read_text()
    path.write_text(shipped + "".join(json.dumps(r) + "\n" for r in out))
    print(f"{path}: {len(out)} ranked on-policy pairs after the {shipped.count(chr(10))} shipped ones")
    return path


def publish(source: Path, name: str, summary: dict, command: str) -> None:
    target = ASSETS / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    for tokenizer_file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                           "special_tokens_map.json"):
        (target / tokenizer_file).unlink(missing_ok=True)  # the base model's tokenizer is the one to use
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(target.iterdir()) if p.is_file()}
    (target / "BUILD.json").write_text(json.dumps({"built_by": "scripts/build_rl_assets.py", "command": command,
                                                   "eval_after": summary["after"], "sha256": files}, indent=2))
    print(f"{target}: {summary['after']}")


def main() -> None:
    only_rm = sys.argv[1:] == ["--only", "rm"]
    if sys.argv[1:] and not only_rm:
        sys.exit("usage: python scripts/build_rl_assets.py [--only rm]")
    with tempfile.TemporaryDirectory() as tmp:
        if only_rm:
            sft_adapter = ASSETS / "reverse-sft-weak"
        else:
            sft = train("sft", Path(tmp) / "sft", [f"train.max_steps={SFT_STEPS}", "train.warmup_steps=5"])
            publish(Path(sft["weights"]), "reverse-sft-weak", sft,
                    f"loraflow train sft train.max_steps={SFT_STEPS} train.warmup_steps=5")
            sft_adapter = Path(sft["weights"])
        pairs = ranked_pairs(sft_adapter, Path(tmp))
        rm = train("rm", Path(tmp) / "rm", [f"data.train={pairs}", f"train.max_steps={RM_STEPS}"])
        publish(Path(rm["weights"]), "reverse-rm", rm,
                f"loraflow train rm data.train=<shipped pairs + ranked on-policy pairs> train.max_steps={RM_STEPS}")


if __name__ == "__main__":
    main()
