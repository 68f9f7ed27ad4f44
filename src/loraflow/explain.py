"""`loraflow explain LOGFILE`: map a failed run's output back to the registry's rules.

A rule is a candidate when one of its signatures appears in the log (a weak, generic signature counts only with
supporting evidence from the same log). Candidates are ranked by what the log reveals: the rule's evidence
patterns (shapes, dtypes, code paths in the traceback) and the package versions the log shows, compared with the
versions the rule affects. Nothing matching means nothing is claimed: explain never guesses.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from loraflow.errors import LoraflowError
from loraflow.rules import Rule, all_rules

STRONG, WEAK = 10.0, 4.0
VERSION_AFFECTED, VERSION_FIXED = 3.0, -12.0
MIN_SCORE = 8.0  # a weak signature alone (4) never reaches it; with evidence it may
MAX_LINES, MAX_LINE_CHARS = 20_000, 2_000

# Where a traceback runs through a framework's own code, its path says which one produced the log.
FRAMEWORK_PATHS = (
    ("openrlhf", r"openrlhf[/\\]|openrlhf\.cli"),
    ("deepspeed-chat", r"dschat[/\\]|DeepSpeed-Chat|deepspeed_chat|applications[/\\]DeepSpeed-Chat"),
    ("llama-factory", r"llamafactory[/\\]|llamafactory-cli|LLaMA-Factory"),
    ("ms-swift", r"[/\\]swift[/\\](llm|trainers|cli)[/\\]|swift (sft|rlhf)"),
    ("axolotl", r"axolotl[/\\]"),
    ("hf", r"trl[/\\]trainer[/\\]|transformers[/\\]trainer\.py|accelerate[/\\]accelerator\.py"),
)

# Lines that print a package version: "DeepSpeed info: version=0.15.3", "deepspeed==0.15.3", "torch 2.5.1",
# "- PyTorch version (GPU?): 2.1.2+cu118", "transformers version: 4.40.0" (transformers-cli env).
_PACKAGES = {"torch": r"torch|pytorch", "deepspeed": r"deepspeed", "transformers": r"transformers",
             "peft": r"peft", "bitsandbytes": r"bitsandbytes", "accelerate": r"accelerate"}
_VERSION = r"(\d+\.\d+(?:\.\d+)?(?:\.?(?:post|dev|rc)\d+)?)"


@dataclass
class Match:
    rule: Rule
    score: float
    lines: list[tuple[int, str]] = field(default_factory=list)
    """(line number, text) of each signature found."""
    reasons: list[str] = field(default_factory=list)

    def to_dict(self, framework: str | None) -> dict:
        return {"rule": self.rule.id, "score": self.score, "title": self.rule.title, "impact": self.rule.impact,
                "what_happened": [f"line {n}: {t}" for n, t in self.lines], "cause": self.rule.cause,
                "conditions": self.rule.conditions, "fix": fix_for(self.rule, framework),
                "fix_loraflow": self.rule.fix, "fixed_in": self.rule.fixed_in,
                "references": list(self.rule.references), "evidence": self.reasons}


def read_log(source: str) -> str:
    """The log as text; undecodable bytes become U+FFFD rather than an error (logs mix encodings)."""
    try:
        if source == "-":
            return sys.stdin.buffer.read().decode("utf-8", errors="replace")
        with open(source, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise LoraflowError(f"explain: log file {source} does not exist; pass a file or `-` for stdin.") from None
    except IsADirectoryError:
        raise LoraflowError(f"explain: {source} is a directory; pass the log file itself.") from None
    except OSError as exc:
        raise LoraflowError(f"explain: cannot read {source}: {exc.strerror or exc}.") from None


def _scanned_lines(text: str) -> list[str]:
    """The lines explain reads: the last MAX_LINES of the log, each cut to MAX_LINE_CHARS. Failures end a log;
    the cap keeps a 100 MB training log or a megabyte-long line from making the regular expressions crawl."""
    lines = text.splitlines()[-MAX_LINES:]
    return [line[:MAX_LINE_CHARS] for line in lines]


def log_versions(text: str) -> dict[str, Version]:
    found: dict[str, Version] = {}
    for package, names in _PACKAGES.items():
        patterns = (rf"(?i)\b(?:{names})\s+info:\s*version\s*=\s*{_VERSION}",
                    # ds_report's dot leaders: "torch version .... 2.1.0+cu121", "deepspeed info ... 0.15.3, ..."
                    rf"(?i)\b(?:{names})\s+(?:version|info)\s*\.{{3,}}\s*v?{_VERSION}",
                    # "deepspeed==0.15.3", "torch 2.5.1", "- `transformers` version: 4.40.0", "PyTorch version (GPU?): 2.1"
                    rf"(?i)`?\b(?:{names})`?(?:\s+version)?(?:\s*\([^)]*\))?\s*(?:==|:|=|\s)\s*v?{_VERSION}\b",
                    rf"(?i)\b(?:{names})-{_VERSION}\.dist-info")
        for pattern in patterns:
            m = re.search(pattern, text)
            if m:
                try:
                    found[package] = Version(m.group(1))
                    break
                except InvalidVersion:
                    continue
    return found


def detect_framework(text: str) -> str | None:
    for name, pattern in FRAMEWORK_PATHS:
        if re.search(pattern, text):
            return name
    return None


def _lines_matching(pattern: str, lines: list[str]) -> list[tuple[int, str]]:
    rx = re.compile(pattern)
    return [(i + 1, line.strip()[:240]) for i, line in enumerate(lines) if rx.search(line)]


def score_rule(rule: Rule, text: str, lines: list[str], versions: dict[str, Version]) -> Match | None:
    # The last occurrence: in a traceback the message line comes after the source line that raised it.
    strong = [hit for s in rule.signatures for hit in _lines_matching(s, lines)[-1:]]
    weak = [hit for s in rule.weak_signatures for hit in _lines_matching(s, lines)[-1:]]
    if not strong and not weak:
        return None
    score = (STRONG + 2.0 * (len(strong) - 1)) if strong else WEAK
    reasons = [f"signature found: {t!r}" for _, t in strong + weak][:3]
    for ev in rule.evidence:
        if re.search(ev.pattern, text):
            score += ev.weight
            reasons.append(f"{'+' if ev.weight > 0 else '-'} {ev.reason}")
    for package, spec in rule.affected.items():
        seen = versions.get(package)
        if seen is None:
            continue
        if seen in SpecifierSet(spec):
            score += VERSION_AFFECTED
            reasons.append(f"+ the log shows {package} {seen}, which is affected ({package}{spec})")
        else:
            score += VERSION_FIXED
            reasons.append(f"- the log shows {package} {seen}, which has the fix ({rule.fixed_in})")
    if score < MIN_SCORE:
        return None
    return Match(rule, score, sorted(set(strong + weak)), reasons)


def explain_text(text: str) -> tuple[list[Match], str | None, dict[str, Version]]:
    lines = _scanned_lines(text)
    scanned = "\n".join(lines)
    versions = log_versions(scanned)
    matches = [m for rule in all_rules() if (m := score_rule(rule, scanned, lines, versions))]
    matches.sort(key=lambda m: -m.score)
    return matches, detect_framework(scanned), versions


def fix_for(rule: Rule, framework: str | None) -> str:
    """The fix worded for the framework the log came from: its flags for the rule's knobs, where known."""
    if framework:
        from loraflow.frontends import flags_for

        flags = flags_for(framework)
        named = [f"{flags[k]}" for k in rule.knobs if k in flags]
        if named:
            return f"in {framework}: change {', '.join(named)} ({rule.elsewhere})"
    return rule.elsewhere or rule.fix


def last_error_line(lines: list[str]) -> str | None:
    rx = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)|AssertionError|RuntimeError)\b.*")
    hits = [line.strip() for line in lines if rx.match(line)]
    return hits[-1][:240] if hits else None


def render(matches: list[Match], framework: str | None, versions: dict[str, Version], text: str,
           source: str) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in versions.items()) or "none shown"
    head = f"explain {source}: framework {framework or 'not recognised'}; versions in the log: {shown}"
    if not matches:
        last = last_error_line(text.splitlines())
        tail = f"\nThe last error line is: {last}" if last else ""
        return (f"{head}\nNo known failure signature in this log ({len(text.splitlines())} lines), so no cause is "
                f"claimed.{tail}\n`loraflow explain --list` shows the signatures loraflow knows.")
    out = [head]
    for rank, m in enumerate(matches, 1):
        r = m.rule
        out += [f"\n{rank}. {r.id}: {r.title}  (score {m.score:g})",
                *[f"   what happened (line {n}): {t}" for n, t in m.lines[:3]],
                f"   cause: {r.cause}", f"   when: {r.conditions}",
                f"   fix: {fix_for(r, framework)}", f"   in loraflow: {r.fix}",
                f"   fixed upstream: {r.fixed_in or 'no'}", f"   references: {', '.join(r.references)}",
                "   why this rank: " + "; ".join(m.reasons)]
    return "\n".join(out)


def list_signatures() -> str:
    out = []
    for r in all_rules():
        sigs = [*r.signatures, *(f"{s}  (weak: needs evidence)" for s in r.weak_signatures)]
        if sigs:
            out.append(f"{r.id}:\n" + "\n".join(f"    {s}" for s in sigs))
        else:
            out.append(f"{r.id}:\n    (no log signature: a silent failure; `loraflow check` or `probe` finds it)")
    return "\n".join(out)
