"""Other frameworks' command lines and config files -> loraflow's normalized Setup, for `loraflow check`.

Interface (one module per framework, registered in FRONTENDS):
  result = from_command(argv, versions)            # argv: the launch line after `loraflow check --`
  result = from_files(framework, paths, versions)   # `loraflow check --framework NAME FILE...`
A FrontendResult carries the Setup, where each field's value came from (a flag, a file key, or the framework's own
default with the source file that sets it), the flags it did not understand (listed, never ignored), and the
framework's flag for each Setup field so fixes can name the exact flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraflow.rules.setup import Setup


@dataclass
class FrontendResult:
    framework: str
    setup: Setup
    sources: dict[str, str] = field(default_factory=dict)
    """Setup field -> where its value came from: `--zero_stage 3`, `ds.json: zero_optimization.stage`,
    or `default (openrlhf/cli/train_sft.py)`."""
    unknown: list[str] = field(default_factory=list)
    """Flags or keys this frontend did not understand; printed, never silently ignored."""
    notes: list[str] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)
    """Setup field -> this framework's flag or key that changes it (used to word fixes)."""
