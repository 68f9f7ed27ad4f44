"""docs/compatibility.md, generated from the registry (scripts/gen_docs.py writes it; a test fails when stale)."""

from __future__ import annotations

from loraflow.rules.registry import SYMPTOMS, Rule, all_rules

VERDICT = {"error": "refused before step 1", "fix": "fixed by the plan", "warning": "warned"}
IMPACT = {"crash": "crash", "silent": "silently wrong", "slow": "memory or speed lost"}


def _versions(rule: Rule) -> str:
    return ", ".join(f"{pkg} {spec}" for pkg, spec in rule.affected.items()) or "all versions"


def _section(rule: Rule) -> list[str]:
    lines = [f"### `{rule.id}`: {rule.title}", "",
             f"- **Without loraflow:** {IMPACT[rule.impact]}. **In loraflow:** {VERDICT[rule.verdict]}.",
             f"- **When:** {rule.conditions}. **Affected versions:** {_versions(rule)}.",
             f"- **Cause:** {rule.cause}",
             f"- **loraflow:** {rule.fix}"]
    if rule.elsewhere:
        lines.append(f"- **Other frameworks:** {rule.elsewhere}")
    if rule.symptoms:
        seen = "; or ".join(SYMPTOMS[s] for s in rule.symptoms)
        lines.append(f"- **First-step guard:** names this rule when {seen}.")
    if rule.log.messages:
        shown = "; ".join(f"`{m.pattern}` ({m.kind}{', ' + m.releases if m.releases else ''})"
                          for m in rule.log.messages)
        lines.append(f"- **Log messages (regular expressions, with how much each alone says):** {shown}")
    lines.append(f"- **Fixed upstream:** {rule.fixed_in or 'no'}")
    lines.append("- **References:** " + ", ".join(rule.references))
    return lines + [""]


def render_markdown() -> str:
    rules = all_rules()
    out = ["# Compatibility rules", "",
           "Generated from `src/loraflow/rules/` by `scripts/gen_docs.py`; do not edit by hand.",
           f"{len(rules)} rules. `loraflow check` evaluates them for a loraflow config or another framework's "
           "launch, `loraflow explain` matches their log signatures, and `loraflow probe` reproduces them live.", "",
           "| id | without loraflow | loraflow | affected versions |", "|---|---|---|---|"]
    out += [f"| [`{r.id}`](#{rule_anchor(r)}) | {IMPACT[r.impact]} | {VERDICT[r.verdict]} | {_versions(r)} |"
            for r in rules]
    out.append("")
    for rule in rules:
        out += _section(rule)
    return "\n".join(out)


def _anchor(title: str) -> str:
    """GitHub's heading anchor for the part after `id: `."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def rule_anchor(rule: Rule) -> str:
    """The anchor of a rule's section in docs/compatibility.md."""
    return f"{rule.id}-{_anchor(rule.title)}"
