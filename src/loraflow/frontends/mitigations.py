"""docs/mitigations.md, generated from the frameworks' declarations (Framework.mitigations): the rules each
framework's own code works around, from which release, and where. scripts/gen_docs.py writes it; a test fails when
it is stale."""

from __future__ import annotations

from loraflow.frontends.base import frameworks
from loraflow.rules import all_rules
from loraflow.rules.docs import rule_anchor


def rows() -> list[tuple[str, str, str, str, str]]:
    """(framework, rule, first release, what its code does, where), in dispatch order."""
    known = {r.id: r for r in all_rules()}
    out = []
    for f in frameworks():
        for m in f.mitigations:
            release = f"{m.package} {m.since}" if m.package else f"{f.title} {m.since}"
            for rule in m.rules:
                if rule not in known:
                    raise KeyError(f"{f.name}: mitigation of unknown rule {rule}")
                out.append((f.title, f"[`{rule}`](compatibility.md#{rule_anchor(known[rule])})", release, m.how,
                            m.source))
    return out


def render_markdown() -> str:
    lines = ["# Frameworks' own workarounds, by release", "",
             "Generated from each frontend's `Framework.mitigations` by `scripts/gen_docs.py`; do not edit by hand.",
             "A framework that works around a rule in its own code closes it for its runs from that release on: "
             "`loraflow check` reports the rule for the releases before it, and for an unknown release names the "
             "one that decides (`depends on`).", "",
             "| framework | rule | from release | what its code does | where |", "|---|---|---|---|---|"]
    lines += [f"| {fw} | {rule} | {since} | {how} | {src} |"
              for fw, rule, since, how, src in rows()]
    return "\n".join(lines) + "\n"
