"""Regenerate src/loraflow/frontends/release_dates.json: every final release of the packages and frameworks `loraflow
check` reads versions of, with the day its first file was uploaded to the package index (PyPI's JSON API). `check
--as-of DATE` takes, for each, the newest release uploaded on or before DATE.

    python scripts/release_dates.py            # needs the package index; writes the table
"""

from __future__ import annotations

import json
import sys
import urllib.request
from datetime import date
from pathlib import Path

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from loraflow.frontends.versions_source import NOT_DATED_BY_INDEX, PYPI_NAMES, RELEASES  # noqa: E402

INDEX = "https://pypi.org/pypi/{}/json"


def upload_dates(pypi_name: str) -> dict[str, str]:
    with urllib.request.urlopen(INDEX.format(pypi_name), timeout=60) as response:
        data = json.load(response)
    out = {}
    for version, files in data["releases"].items():
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        days = [f["upload_time_iso_8601"][:10] for f in files if not f.get("yanked")]
        if days and not parsed.is_prerelease:
            out[str(parsed)] = min(days)
    return dict(sorted(out.items(), key=lambda kv: Version(kv[0])))


def main() -> int:
    table = {}
    for name, pypi in PYPI_NAMES.items():
        if name in NOT_DATED_BY_INDEX:
            continue
        table[name] = upload_dates(pypi)
        print(f"{name}: {len(table[name])} releases, {min(table[name].values())} to {max(table[name].values())}")
    RELEASES.write_text(json.dumps({"generated": date.today().isoformat(), "source": INDEX.format("NAME"),
                                    "releases": table}, indent=1) + "\n")
    print(f"wrote {RELEASES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
