"""Write the preference pairs and RL prompts of the demo task (seeded and re-runnable; a second):

- assets/reverse/prefs-{train,eval}.jsonl: "Please write the word WORD backwards." with chosen = the reversal and
  rejected = a plausible wrong answer: half near misses of the reversal (adjacent letters swapped, a letter
  dropped or replaced, the word unreversed), half what the base model answers in chat instead (the other games it
  learned: capitals, spelled out, said twice, letter count).
- assets/reverse/prompts-{train,eval}.jsonl: the same requests with the reversal as `answer` (read by
  loraflow.rl.rewards).
The words are those of assets/reverse/train.jsonl and eval.jsonl, so held-out words stay held out.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

REVERSE = Path(__file__).resolve().parent.parent / "src" / "loraflow" / "assets" / "reverse"
LETTERS = "abcdefghijklmnoprstuvz"


def words(name: str) -> list[str]:
    out = []
    for line in (REVERSE / name).read_text().splitlines():
        text = json.loads(line)["messages"][0]["content"]
        out.append(text.split("the word ", 1)[1].split(" backwards", 1)[0])
    return out


def near_miss(word: str, rng: random.Random) -> str:
    rev = word[::-1]
    kind = rng.randrange(4)
    if kind == 0 and len(rev) > 1:
        i = rng.randrange(len(rev) - 1)
        return rev[:i] + rev[i + 1] + rev[i] + rev[i + 2:]
    if kind == 1 and len(rev) > 2:
        i = rng.randrange(len(rev))
        return rev[:i] + rev[i + 1:]
    if kind == 2:
        i = rng.randrange(len(rev))
        return rev[:i] + rng.choice([c for c in LETTERS if c != rev[i]]) + rev[i + 1:]
    return word


def other_game(word: str, rng: random.Random) -> str:
    return rng.choice([word.upper(), " ".join(word), f"{word} {word}", str(len(word))])


def rejected(word: str, rng: random.Random) -> str:
    for _ in range(20):
        answer = near_miss(word, rng) if rng.random() < 0.5 else other_game(word, rng)
        if answer != word[::-1]:
            return answer
    return word.upper() + "!"


def request(word: str) -> list[dict]:
    return [{"role": "user", "content": f"Please write the word {word} backwards."}]


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{path}: {len(records)} records")


def main() -> None:
    rng = random.Random(5)
    for split in ("train", "eval"):
        ws = words(f"{split}.jsonl")
        write(REVERSE / f"prefs-{split}.jsonl",
              [{"prompt": request(w), "chosen": w[::-1], "rejected": rejected(w, rng)} for w in ws])
        write(REVERSE / f"prompts-{split}.jsonl", [{"prompt": request(w), "answer": w[::-1]} for w in ws])


if __name__ == "__main__":
    main()
