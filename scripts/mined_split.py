"""Set aside a random fifth of the mined threads (tests/fixtures/mined/*.jsonl) before any rule is written from them,
and keep that choice fixed: a thread is set aside when the SHA-256 of SALT + its id falls in the first fifth of the
hash range. The choice is random (the hash of a salt fixed before the sample was read) and stable (a thread mined
later is set aside or not by the same test, without moving any thread already assigned).

    python scripts/mined_split.py            # write tests/fixtures/mined/SET_ASIDE.json
    python scripts/mined_split.py --check    # exit 1 if SET_ASIDE.json is not what the rule gives
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

MINED = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mined"
SALT = "loraflow-issue-31-set-aside-2026-11-27"
"""Fixed when the first 324 threads were mined, before any of them was read to write a rule."""


def set_aside(thread_id: str) -> bool:
    digest = hashlib.sha256(f"{SALT}:{thread_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 5 == 0


def mined_ids(folder: Path = MINED) -> list[str]:
    ids = []
    for path in sorted(folder.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    ids.append(json.loads(line)["id"])
                except (json.JSONDecodeError, KeyError) as e:
                    sys.exit(f"error: {path}:{number}: not a mined record ({e}); see {folder / 'README.md'}")
    return sorted(ids)


def split(ids: list[str]) -> dict:
    aside = [i for i in ids if set_aside(i)]
    return {"salt": SALT, "rule": "sha256(salt + ':' + id)[:8] % 5 == 0", "threads": len(ids),
            "set_aside": aside}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with SET_ASIDE.json instead of writing it")
    args = p.parse_args(argv)
    want = split(mined_ids())
    target = MINED / "SET_ASIDE.json"
    if args.check:
        have = json.loads(target.read_text()) if target.exists() else None
        if have != want:
            print(f"{target} is stale: run python scripts/mined_split.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(json.dumps(want, indent=1) + "\n")
    print(f"{len(want['set_aside'])} of {want['threads']} threads set aside -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
