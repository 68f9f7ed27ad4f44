"""`loraflow check` on the frameworks' own official examples (tests/fixtures/frontends/official/MANIFEST.json): a
shipped example, run with the releases current at its tag, trains. An exit 2 there is either a known upstream bug
(the manifest cites the issue) or a false alarm of check; these assertions fail when a fixed false alarm returns.
Each example is checked from its own directory, with its versions found as `loraflow check` finds them
(--versions, then --versions-from, then --as-of)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.versions_source import Dated, Versions, versions_as_of, versions_from_file

OFFICIAL = ROOT / "tests" / "fixtures" / "frontends" / "official"
EXAMPLES = json.loads((OFFICIAL / "MANIFEST.json").read_text())["examples"]
SERIOUS = ("crash", "silent")


def _versions(example: dict, root: Path) -> tuple[dict, Dated]:
    found = Versions()
    if example["versions"]:
        found.fill(parse_versions(example["versions"]), "--versions")
    if example["versions_from"]:
        found.fill(versions_from_file(str(root / example["versions_from"])), "--versions-from")
    found.fill(versions_as_of(example["as_of"]), "--as-of")
    dated = Dated(example["as_of"], {p for p, source in found.sources.items() if source == "--as-of"})
    return dict(found.values), dated


def _materialize(example: dict, tmp_path: Path) -> Path:
    """The example's folder as it was at its tag: files several examples share (one release's PEFT train.py) are
    kept once under _shared/ and put in place here."""
    root = OFFICIAL / example["id"]
    if not example.get("shared"):
        return root
    copy = tmp_path / example["id"]
    shutil.copytree(root, copy)
    for dest, source in example["shared"].items():
        (copy / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(OFFICIAL / source, copy / dest)
    return copy


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["id"] for e in EXAMPLES])
def test_official_example_reads_as_recorded(example, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default accelerate config: as on a fresh machine
    root = _materialize(example, tmp_path)
    monkeypatch.chdir(root / example["cwd"])
    versions, dated = _versions(example, root)
    text, code = run_check(list(example["argv"]), None, [], versions, True, None, dated)
    doc = json.loads(text)
    serious = {f["rule"]: f["holds_if"] for f in doc["findings"] if f["impact"] in SERIOUS}
    assert doc["framework"] == example["framework"]
    # Unconditional findings exactly: a false alarm that returns (or a real bug no longer seen) fails here.
    assert {r for r, cond in serious.items() if cond is None} == \
        {r for r, cond in example["expected_serious"].items() if cond is None}
    assert set(serious) == set(example["expected_serious"])
    assert code == example["expected_exit"], doc["findings"]


def test_manifest_is_complete_and_every_exit_2_cites_its_issue():
    frameworks = {e["release"].split()[0] for e in EXAMPLES}
    assert len(EXAMPLES) >= 40 and len(frameworks) == 16
    for example in EXAMPLES:
        assert example["source"].startswith("https://github.com/") and "/blob/" in example["source"]
        for name in example["files"]:
            assert (OFFICIAL / example["id"] / name).is_file(), (example["id"], name)
        for source in example.get("shared", {}).values():
            assert (OFFICIAL / source).is_file(), (example["id"], source)
        if example["expected_exit"] == 2:
            assert "https://github.com/" in example["reason"] and "/issues/" in example["reason"], example["id"]
        if "before_audit" in example:
            assert example["before_audit"]["false_alarm"], example["id"]
