"""Regenerate src/loraflow/frontends/peft_default_targets.json: for each model type, the first PEFT release whose LoRA
default target table (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) names it. A LoraConfig without
target_modules takes its targets from that table by the model's config.model_type, and PEFT refuses a type it does
not list (`Please specify `target_modules` in `peft_config``, rule lora-no-default-targets). Read from PEFT's own
wheels on the package index, one per final release in release_dates.json.

    python scripts/peft_default_targets.py [WHEEL_DIR]   # downloads the wheels there (default ~/.cache/loraflow/peft)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "loraflow" / "frontends" / "peft_default_targets.json"
DATES = ROOT / "src" / "loraflow" / "frontends" / "release_dates.json"
TABLE = "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"


def wheel(release: str, folder: Path) -> Path:
    found = sorted(folder.glob(f"peft-{release}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"peft=={release}", "-d",
                        str(folder)], check=True)
        found = sorted(folder.glob(f"peft-{release}-*.whl"))
    return found[0]


def model_types(path: Path) -> set[str] | None:
    """The keys of the LoRA default-target table in one wheel (the module that assigns it), or None if absent."""
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if not name.endswith(".py"):
                continue
            source = z.read(name).decode("utf-8", errors="replace")
            if TABLE not in source:
                continue
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                        isinstance(t, ast.Name) and t.id == TABLE for t in node.targets):
                    return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return None


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path.home() / ".cache" / "loraflow" / "peft"
    folder.mkdir(parents=True, exist_ok=True)
    dates = json.loads(DATES.read_text())["releases"]["peft"]
    releases = sorted((v for v in dates if not Version(v).is_prerelease and Version(v) >= Version("0.1.0")),
                      key=Version)
    since: dict[str, str] = {}
    dropped: dict[str, str] = {}
    read = []
    for release in releases:
        types = model_types(wheel(release, folder))
        if types is None:
            continue
        read.append(release)
        for t in sorted(types):
            since.setdefault(t, release)
            dropped.pop(t, None)
        for t in since:
            if t not in types and t not in dropped:
                dropped[t] = release
    doc = {"source": f"peft wheels on the package index, {TABLE}, releases {read[0]} - {read[-1]}",
           "releases": read, "since": dict(sorted(since.items())), "dropped": dict(sorted(dropped.items()))}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}: {len(since)} model types over {len(read)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
