"""Regenerate src/loraflow/frontends/nemo_rl_keys.json from a git checkout of NVIDIA-NeMo/RL (its tags): every key of
the base config of each entry point (examples/configs/grpo_math_1B.yaml, sft.yaml, dpo.yaml) at each release, with
the releases that have it and its default at each; and, for every YAML under examples/configs, the settings the
nemo-rl frontend of `loraflow check` reads, composed over the file's `defaults:` chain as NeMo-RL's load_config does
(nemo_rl/utils/config.py). The frontend reads its defaults from this table (each default cites the release and file
that set it), dates a launch by the keys it overrides (a key exists only in some releases), lists overrides of keys no
release has, and reads a `--config examples/configs/X.yaml` that is not on this machine from the same table.

    python scripts/nemo_rl_keys.py PATH/TO/NeMo-RL        # a clone with its tags; writes the table
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "loraflow" / "frontends" / "nemo_rl_keys.json"
CONFIGS = "examples/configs"
# tag -> the release on the package index (nemo-rl; v0.1 and v0.2 were published as NeMo-Reinforcer, nemo_reinforcer).
TAGS = {"v0.1.0": "0.1.0", "v0.1.1": "0.1.1", "v0.2.0": "0.2.0", "v0.2.1": "0.2.1", "v0.3.0": "0.3.0",
        "v0.3.1": "0.3.1", "v0.4.0": "0.4.0", "v0.5.0": "0.5.0", "v0.6.0": "0.6.0", "v0.7.0": "0.7.0"}
ENTRIES = {"grpo": "grpo_math_1B.yaml", "sft": "sft.yaml", "dpo": "dpo.yaml"}
# The settings the frontend reads (frontends/nemo_rl.py): the only keys kept for the example files.
READ = ("policy.model_name", "policy.precision", "policy.fsdp_offload_enabled",
        "policy.activation_checkpointing_enabled",
        "policy.dtensor_cfg.enabled", "policy.dtensor_cfg._v2", "policy.dtensor_cfg.cpu_offload",
        "policy.dtensor_cfg.sequence_parallel", "policy.dtensor_cfg.activation_checkpointing",
        "policy.dtensor_cfg.tensor_parallel_size", "policy.dtensor_cfg.context_parallel_size",
        "policy.dtensor_cfg.lora_cfg.enabled", "policy.dtensor_cfg.lora_cfg.dim",
        "policy.dtensor_cfg.lora_cfg.target_modules", "policy.dtensor_cfg.lora_cfg.match_all_linear",
        "policy.megatron_cfg.enabled", "policy.megatron_cfg.peft.enabled", "policy.megatron_cfg.peft.dim",
        "policy.generation.backend", "policy.generation.vllm_cfg.gpu_memory_utilization",
        "policy.generation.vllm_cfg.async_engine", "policy.generation.colocated.enabled",
        "policy.sequence_packing.enabled", "loss_fn.use_importance_sampling_correction",
        "loss_fn.truncated_importance_sampling_ratio", "cluster.num_nodes", "cluster.gpus_per_node")


def show(repo: Path, tag: str, path: str) -> dict | None:
    done = subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    try:
        data = yaml.safe_load(done.stdout)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def compose(repo: Path, tag: str, path: str, depth: int = 0) -> dict | None:
    """The config at `path` merged over its `defaults:` (a path, or a list of paths, relative to the file), as
    nemo_rl/utils/config.py load_config_with_inheritance does."""
    data = show(repo, tag, path)
    if data is None or depth > 5:
        return data
    parents = data.pop("defaults", None)
    out: dict = {}
    for parent in [parents] if isinstance(parents, str) else parents or []:
        base = compose(repo, tag, posixpath.normpath(posixpath.join(posixpath.dirname(path), str(parent))), depth + 1)
        merge(out, base or {})
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
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def history(rows: dict, key: str, bit: int, release: str, value) -> None:
    row = rows.setdefault(key, [0, []])
    row[0] |= 1 << bit
    if not row[1] or row[1][-1][1] != value:
        row[1].append([release, value])


def entry_table(repo: Path, name: str) -> dict:
    """key -> [releases that have it (bit i: the i-th of TAGS), [[release, default], ...] at each change]."""
    seen: dict[str, list] = {}
    for i, (tag, release) in enumerate(TAGS.items()):
        data = compose(repo, tag, f"{CONFIGS}/{name}")
        for key, value in flat(data or {}).items():
            history(seen, key, i, release, value)
    return {"file": f"{CONFIGS}/{name}", "keys": dict(sorted(seen.items()))}


def example_table(repo: Path) -> dict:
    """examples/configs/X.yaml -> {key: [releases, [[release, value], ...]]} for the READ keys, and `_in`: the
    releases that have the file. The files directly in examples/configs (the ones README and docs/guides launch); the
    test-suite recipes under recipes/ are read when they are on this machine."""
    files: dict[str, dict] = {}
    for i, (tag, release) in enumerate(TAGS.items()):
        listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", tag, f"{CONFIGS}/"],
                                capture_output=True, text=True, check=True).stdout.split()
        for path in listed:
            if not path.endswith((".yaml", ".yml")):
                continue
            data = compose(repo, tag, path)
            if data is None or "policy" not in data:
                continue  # evaluation configs and fragments: no policy is trained
            rows = files.setdefault(path, {"_in": [0, []]})
            rows["_in"][0] |= 1 << i
            values = flat(data)
            for key in READ:
                if key in values:
                    history(rows, key, i, release, values[key])
    return dict(sorted(files.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    repo = Path(argv[0])
    commits = {release: subprocess.run(["git", "-C", str(repo), "rev-parse", f"{tag}^{{commit}}"], capture_output=True,
                                       text=True, check=True).stdout.strip() for tag, release in TAGS.items()}
    doc = {"source": "https://github.com/NVIDIA-NeMo/RL at its tags (v0.1 - v0.2 as NVIDIA/NeMo-RL's nemo_reinforcer)",
           "releases": list(TAGS.values()), "commits": commits,
           "entries": {entry: entry_table(repo, name) for entry, name in ENTRIES.items()},
           "examples": example_table(repo)}
    OUT.write_text(json.dumps(doc, indent=None, separators=(",", ":"), default=str) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{e} {len(t['keys'])} keys" for e, t in doc["entries"].items())
          + f", {len(doc['examples'])} example configs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
