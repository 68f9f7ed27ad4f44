"""Regenerate the generated docs (docs/configuration.md). A test fails when they are stale."""

from pathlib import Path

from loraflow.config.docs import render_markdown

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    (ROOT / "docs" / "configuration.md").write_text(render_markdown())
    print("wrote docs/configuration.md")
