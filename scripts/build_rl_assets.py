"""Build the trained assets the RL demos start from, with loraflow itself (seeded; about a minute on 2 cores):

- assets/reverse-sft-weak: a LoRA adapter from a short SFT run of the reversal task (30 steps), which answers
  some held-out words right and many wrong. GRPO and PPO start from it (model.merge_adapters), so their demos
  show reinforcement learning improving a policy that is partly there, as in the usual SFT -> RL pipeline.
- assets/reverse-rm: the reward model of `loraflow train rm` with its embedded default, used by the PPO demo
  (rl.reward_model).

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
        rm = train("rm", Path(tmp) / "rm", [])
        publish(Path(rm["weights"]), "reverse-rm", rm, "loraflow train rm")


if __name__ == "__main__":
    main()
