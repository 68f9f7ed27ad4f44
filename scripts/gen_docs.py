"""Regenerate the generated docs (docs/configuration.md, docs/compatibility.md, docs/mitigations.md). Tests fail when
they are stale."""

from pathlib import Path

from loraflow.config.docs import render_markdown as configuration
from loraflow.frontends.mitigations import render_markdown as mitigations
from loraflow.rules.docs import render_markdown as compatibility

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    for name, render in (("configuration.md", configuration), ("compatibility.md", compatibility),
                         ("mitigations.md", mitigations)):
        (ROOT / "docs" / name).write_text(render())
        print(f"wrote docs/{name}")
