"""loraflow's own logs: how `explain` recognises them, what loraflow itself said in them, and fixes in its keys.

A loraflow run's console output and RUN_DIR/train.log are recognised by the lines only loraflow writes (its plan's
header, the run directory with the trainable-parameter or step count, `ERROR run failed:`, frames through its run
code), never by the file name. They are read before any other framework's patterns because they quote others: the
plan's reasons name DeepSpeed-Chat's flags, and DeepSpeed's own lines appear when its engine runs.

loraflow also names its rules itself: a plan refusal (`[ERROR] rule-id:`) and a first-step guard (`[rule-id]`)
say which rule, while the plan's rendered decisions and findings quote other failures' messages in their causes.
So the plan block and the rendered findings are blanked before the rules' messages are matched (a clean FSDP2 run
whose plan applied fsdp2-generate-unsharded would otherwise be diagnosed with it), and loraflow's own words are
read separately here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from loraflow.explain.prefix import strip_prefix

# What logging's `%(asctime)s %(levelname)s ` (train.log) or the `[rank N] ` of other ranks puts before a line.
_HEAD = r"^(?:\d{4}-\d\d-\d\d [\d:,.]+ [A-Z]+ |\[rank [^\]]{1,8}\] )?"
_PLAN = re.compile(_HEAD + r"loraflow plan: stage \w+; ", re.MULTILINE)
_RUN_DIR = re.compile(_HEAD + r"run directory: \S", re.MULTILINE)
# Lines loraflow's run writes after its run directory (run/, loop/trainer.py): with it they name a loraflow run.
_RUN_LINES = re.compile(_HEAD + r"(?:trainable parameters: [\d,]+ of [\d,]+$|training: \d+ optimizer steps of |"
                        r"no config.{0,20} given: training the built-in demo |"
                        r"eval \((?:before|after) training, step \d+\): |error: )", re.MULTILINE)
# loop/trainer.py's progress line in train.log: names a loraflow run on its own, when a long log's head is cut off.
_STEP = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ INFO step \d+/\d+: loss \S+, grad_norm \S+, lr \S+, [\d,]+ tokens/s",
                   re.MULTILINE)
# run/failures.py's log_fatal: `run failed: Type: message` (`run stopped:` for an interrupt), the traceback after it.
_RUN_FAILED = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ ERROR run (?:failed|stopped): ([\w.]+): ?(.*)$")
# A traceback through loraflow's run code (not its probes, which reproduce other setups without loraflow's plan).
_OWN_FRAME = re.compile(r'loraflow[/\\](?:run|trainer|cli|guards|plan|checkpoint|pipeline|logprobs|evaluate|'
                        r'reference)\.py|loraflow[/\\](?:stages|engines|setup|data)[/\\]')
_CONSOLE_ERROR = re.compile(r"^error: (.*)$")
_UNEXPECTED = "failed unexpectedly (a bug"
_FINDING = re.compile(r"^\s*\[(ERROR|FIXED|WARN)\] ([a-z0-9][a-z0-9-]*): ")
_FINDING_MORE = re.compile(r"^\s+(?:cause|fix|note): ")
_GUARD_CAUSE = re.compile(r"^\s*- \[([a-z0-9][a-z0-9-]*)\] ")
_BRACKETED = re.compile(r"\[([a-z0-9-]+(?:, [a-z0-9-]+)*)\]")
_REFUSAL = "this setup cannot work"

# Combination field (a rule's knob) -> the loraflow config key that changes it. Knobs the plan always settles itself
# (the input-grad hook, use_cache, gathers, wrap order) have no key: a failure there is the plan's bug.
KEYS = {
    "reentrant": "checkpointing.reentrant",
    "checkpointing": "checkpointing.enabled / checkpointing.layers / checkpointing.every_n_layers",
    "checkpoint_impl": "checkpointing.granularity",
    "checkpoint_every_n": "checkpointing.every_n_layers",
    "zero_stage": "parallel.zero_stage",
    "engine": "parallel.engine",
    "fsdp_use_orig_params": "parallel.engine",
    "offload": "parallel.offload_optimizer / parallel.offload_params",
    "find_unused_parameters": "parallel.find_unused_parameters",
    "precision": "precision.mode",
    "mixed_param_dtypes": "precision.mode",
    "packing": "data.packing",
    "matched_modules": "adapter.target_modules",
    "adapter": "adapter.method",
    "quantization": "model.quantization.method",
    "embeddings_trainable": "adapter.train_modules",
    "lm_head_trainable": "adapter.train_modules",
}


def _error_types() -> frozenset[str]:
    """The names of loraflow.errors' classes: what loraflow raises on purpose, with the fix in its message."""
    from loraflow import errors

    return frozenset(name for name, obj in vars(errors).items()
                     if isinstance(obj, type) and issubclass(obj, errors.LoraflowError))


@dataclass
class FatalError:
    """The error that ended a loraflow run, as loraflow wrote it."""
    line_no: int
    kind: str
    """The exception class (`DataError`), or `error` for the console's `error:` line, which does not name it."""
    message: str

    @property
    def own(self) -> bool:
        """loraflow raised it on purpose (its message says what to change), rather than a crash inside it."""
        return self.kind == "error" or self.kind in _error_types()

    @property
    def headline(self) -> str:
        """The message's first line; with the first item when that line only announces a list (a ConfigError's
        `1 configuration problem(s):`, a PlanError's findings)."""
        lines = [line.strip() for line in self.message.splitlines() if line.strip()]
        first = lines[0] if lines else ""
        if first.endswith(":") and len(lines) > 1:
            first = f"{first} {lines[1]}"
        return f"{self.kind}: {first[:400]}"


@dataclass
class OwnLog:
    """What loraflow itself said in its log."""
    fatal: FatalError | None = None
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Rule id -> (line, text) of each `[ERROR]` finding of a plan that refused the setup."""
    guarded: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Rule id -> (line, text) of each rule a first-step guard named as the likely cause."""
    masked: list[int] = field(default_factory=list)
    """Line numbers (from 1) of loraflow's own plan and findings, blanked before the rules' messages are matched."""


def is_loraflow_log(text: str) -> bool:
    """Whether the log was written by a loraflow run (its distinctive lines, not a file name)."""
    if _PLAN.search(text) or _STEP.search(text):
        return True
    if _RUN_DIR.search(text) and _RUN_LINES.search(text):
        return True
    if any(_RUN_FAILED.match(line) for line in text.splitlines()):
        return True
    return bool(_OWN_FRAME.search(text))


def _plan_block(lines: list[str], start: int) -> int:
    """The index after the rendered plan that starts at `start` (plan.render(): header, `model:`, indented
    decisions, `findings:` and the indented findings)."""
    end = start + 1
    while end < len(lines) and (lines[end][:1].isspace() or lines[end].startswith(("model: ", "findings:"))):
        end += 1
    return end


def _fatal(lines: list[str]) -> FatalError | None:
    """The last `ERROR run failed: Type: message` of train.log, else the CLI's last `error: message` line, with the
    message's continuation lines (up to a traceback, a new log record or an unindented line)."""
    found = None
    for i, line in enumerate(lines):
        m = _RUN_FAILED.match(line)
        if m:
            found = (i, m.group(1).rsplit(".", 1)[-1], m.group(2), "log")
    if found is None:
        for i, line in enumerate(lines):
            m = _CONSOLE_ERROR.match(strip_prefix(line))
            if m and _UNEXPECTED not in m.group(1):
                found = (i, "error", m.group(1), "console")
    if found is None:
        return None
    i, kind, first, where = found
    body = [first]
    for line in lines[i + 1:]:
        if line.startswith("Traceback (most recent call last)") or re.match(r"^\d{4}-\d\d-\d\d ", line):
            break
        if where == "console" and not (line[:1].isspace() or _FINDING.match(line)):
            break
        if where == "log" and not line.strip():
            break
        body.append(line.rstrip())
    return FatalError(i + 1, kind, "\n".join(body).strip())


def read_own(lines: list[str]) -> OwnLog:
    """loraflow's own statements in a log it wrote, and the lines to blank before matching the rules' messages."""
    own = OwnLog(fatal=_fatal(lines))
    masked: set[int] = set()
    i = 0
    while i < len(lines):
        if _PLAN.match(lines[i]):
            end = _plan_block(lines, i)
            masked.update(range(i, end))
            i = end
            continue
        i += 1
    in_finding = False
    for i, line in enumerate(lines):
        finding = _FINDING.match(line)
        if finding:
            masked.add(i)
            in_finding = True
            if finding.group(1) == "ERROR":
                own.refused.setdefault(finding.group(2), (i + 1, line.strip()[:240]))
            continue
        if in_finding and _FINDING_MORE.match(line):
            masked.add(i)
            continue
        in_finding = False
        cause = _GUARD_CAUSE.match(line)
        if cause:
            masked.add(i)
            own.guarded.setdefault(cause.group(1), (i + 1, line.strip()[:240]))
    fatal = own.fatal
    if fatal and fatal.kind in ("GuardError", "error") and _REFUSAL not in fatal.message:
        # assert_train_mode names its rules in one bracket: `[checkpointing-off-in-eval, zero3-eval-backward]`.
        for group in _BRACKETED.findall(fatal.message.splitlines()[0]):
            for rule_id in group.split(", "):
                own.guarded.setdefault(rule_id, (fatal.line_no, fatal.headline[:240]))
    own.masked = sorted(n + 1 for n in masked)
    return own


def masked_text(lines: list[str], own: OwnLog) -> str:
    """The log with loraflow's own plan and findings blanked (line numbers kept; a placeholder rather than an empty
    line, so that the log keeps its shape: a plan and an error line are not a one-line paste)."""
    out = list(lines)
    for n in own.masked:
        out[n - 1] = "(loraflow plan)"
    return "\n".join(out)


def loraflow_fix(rule, own: OwnLog | None) -> str:
    """A rule's fix for a loraflow run, in loraflow's keys; where the plan should have prevented the failure, that
    it is loraflow's bug."""
    keys = list(dict.fromkeys(KEYS[k] for k in rule.knobs if k in KEYS))
    change = f" Until it is fixed, you can avoid it by changing {', '.join(keys)}." if keys else ""
    if own is not None and rule.id in own.refused:
        return f"loraflow refused this setup before training, as it should: {rule.fix}"
    guard = ("loraflow's first-step guard stopped the run before any update, but "
             if own is not None and rule.id in own.guarded else "")
    act = {"error": "refused", "fix": "fixed"}.get(rule.verdict, "warned about")
    return (f"{guard}loraflow's plan should have {act} this ({rule.id}: {rule.fix.rstrip('.')}); that it reached "
            f"the run is a bug in loraflow: report it with plan.json from the run directory.{change}")
