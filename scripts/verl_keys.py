"""Regenerate src/loraflow/frontends/verl_keys.json: every key of verl's Hydra configs at each release, with the
releases that have it and its default at each, read from a git checkout of volcengine/verl (its tags). The verl
frontend of `loraflow check` reads its defaults from this table (so each default cites the release and file that set
it), dates a launch by the keys it overrides (a key exists only in some releases), and lists overrides of keys no
release has.

    python scripts/verl_keys.py PATH/TO/verl        # a clone with its tags; writes the table
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "loraflow" / "frontends" / "verl_keys.json"
CONFIG = "verl/trainer/config"
# tag -> the release it is on the package index; `main` (the newest commit read) counts as the first release after
# the last tag, so a key first seen there dates a launch as newer than that tag.
TAGS = {"v0.1": "0.1", "v0.2": "0.2", "v0.3.0.post1": "0.3.0.post1", "v0.4.0": "0.4.0", "v0.4.1": "0.4.1",
        "v0.5.0": "0.5.0", "v0.6.0": "0.6.0", "v0.6.1": "0.6.1", "v0.7.0": "0.7.0", "HEAD": "0.7.1"}
# Each entry point's config: the composed file (v0.5.0 on, PPO's `_generated_` file is the composition), or the file
# and the `defaults:` groups Hydra composes into it.
ENTRIES = {
    "ppo": ("_generated_ppo_trainer.yaml", "ppo_trainer.yaml"),
    "sft": ("sft_trainer.yaml",),
    "sft_engine": ("sft_trainer_engine.yaml",),
}


def show(repo: Path, tag: str, path: str) -> dict | None:
    done = subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], capture_output=True, text=True)
    return yaml.safe_load(done.stdout) if done.returncode == 0 else None


def compose(repo: Path, tag: str, name: str) -> dict | None:
    """The config `name` at `tag` with its `defaults:` groups (`group@package: file`) merged in, as Hydra does."""
    data = show(repo, tag, f"{CONFIG}/{name}")
    if data is None:
        return None
    out: dict = {}
    for entry in data.pop("defaults", []) or []:
        if not isinstance(entry, dict):
            continue  # `_self_`
        (target, file), = entry.items()
        group, _, package = target.partition("@")
        part = show(repo, tag, f"{CONFIG}/{group}/{file}.yaml") or {}
        out.setdefault(package or group, {}).update(part)
    return merge(out, data)


def merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if str(key) in ("_target_", "defaults"):
            continue
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def table(repo: Path, files: tuple[str, ...]) -> dict:
    """key -> [releases that have it (bit i: the i-th of TAGS), [[release, default], ...] at each change]."""
    seen: dict[str, list] = {}
    read_from = {}
    for i, (tag, release) in enumerate(TAGS.items()):
        name = next((f for f in files if show(repo, tag, f"{CONFIG}/{f}") is not None), None)
        data = compose(repo, tag, name) if name else None
        if data is None:
            continue
        read_from[release] = f"{CONFIG}/{name}"
        for key, value in flat(data).items():
            row = seen.setdefault(key, [0, []])
            row[0] |= 1 << i
            if not row[1] or row[1][-1][1] != value:
                row[1].append([release, value])
    return {"files": read_from, "keys": dict(sorted(seen.items()))}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    repo = Path(argv[0])
    head = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%H %cs"], capture_output=True,
                          text=True, check=True).stdout.split()
    doc = {"source": "https://github.com/volcengine/verl at its tags; `main` is commit "
                     f"{head[0]} ({head[1]}), read as the first release after v0.7.0",
           "releases": list(TAGS.values()),
           "entries": {entry: table(repo, files) for entry, files in ENTRIES.items()}}
    OUT.write_text(json.dumps(doc, indent=None, separators=(",", ":"), default=str) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{e} {len(t['keys'])} keys" for e, t in doc["entries"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
