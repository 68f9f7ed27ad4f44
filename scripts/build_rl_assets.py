"""Build the trained assets the RL demos start from, with loraflow itself (seeded; about a minute on 2 cores):

- assets/reverse-sft-weak: a LoRA adapter from a short SFT run of the reversal task (30 steps), which answers
  some held-out words right and many wrong. GRPO and PPO start from it (model.merge_adapters), so their demos
  show reinforcement learning improving a policy that is partly there, as in the usual SFT -> RL pipeline.
- assets/reverse-rm: the reward model the PPO demo uses (rl.reward_model). Like InstructGPT's, its comparisons
  include the policy's own samples: the shipped pairs plus, for every training word, the reversal preferred over
  each wrong answer the weak SFT policy samples (written to a temporary file, not shipped). A reward model that has
  only seen hand-made mistakes scores the policy's own drift arbitrarily, and PPO learns to exploit that.

Run: python scripts/build_rl_assets.py   (after scripts/build_rl_data.py; it rewrites both directories and
records the files' sha256 in each BUILD.json).
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


def train(stage: str, run_dir: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "loraflow", "train", stage, f"output.dir={run_dir}", "output.progress_bar=false",
           "output.tensorboard=false", *overrides]
    subprocess.run(cmd, check=True)
    return json.loads((run_dir / "summary.json").read_text())


def onpolicy_pairs(adapter: Path, directory: Path, samples: int = 4) -> Path:
    """Pairs (reversal preferred over each wrong sample of the weak SFT policy) for every training word."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loraflow.rollout import decode, generate, stop_ids

    base = ASSETS / "tiny-base"
    tok = AutoTokenizer.from_pretrained(base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload().eval()
    records = [json.loads(line) for line in (ASSETS / "reverse" / "prompts-train.jsonl").read_text().splitlines()]
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True) for r in records]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    width, stop, out = max(map(len, prompts)), stop_ids(model, tok), []
    torch.manual_seed(0)
    for start in range(0, len(records), 100):
        chunk = list(range(start, min(start + 100, len(records))))
        rows = [i for i in chunk for _ in range(samples)]
        keys = [(0, 0, i, k) for i in chunk for k in range(samples)]
        texts = decode(tok, generate(model, [prompts[i] for i in rows], width, 16, stop, tok.pad_token_id, "cpu",
                                     keys, 1.0), stop)
        for i, text in zip(rows, texts):
            answer = records[i]["answer"]
            if text and text != answer:
                out.append({"prompt": records[i]["prompt"], "chosen": answer, "rejected": text})
    path = directory / "prefs-onpolicy.jsonl"
    shipped = (ASSETS / "reverse" / "prefs-train.jsonl").read_text()
    path.write_text(shipped + "".join(json.dumps(r) + "\n" for r in out))
    print(f"{path}: {len(out)} on-policy pairs after the {shipped.count(chr(10))} shipped ones")
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
    with tempfile.TemporaryDirectory() as tmp:
        sft = train("sft", Path(tmp) / "sft", [f"train.max_steps={SFT_STEPS}", "train.warmup_steps=5"])
        publish(Path(sft["weights"]), "reverse-sft-weak", sft,
                f"loraflow train sft train.max_steps={SFT_STEPS} train.warmup_steps=5")
        pairs = onpolicy_pairs(Path(sft["weights"]), Path(tmp))
        rm = train("rm", Path(tmp) / "rm", [f"data.train={pairs}", "train.max_steps=300"])
        publish(Path(rm["weights"]), "reverse-rm", rm,
                "loraflow train rm data.train=<shipped pairs + on-policy pairs> train.max_steps=300")


if __name__ == "__main__":
    main()
