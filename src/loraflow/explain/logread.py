"""Reading a pasted or captured log into what `explain` reasons about: its lines, the traceback frames, the error
lines, the printed package versions, and its shape (a whole traceback, one that stops before its error line, only
a warning, only a metadata dump, a one-line paste)."""

from __future__ import annotations

import html
import re
import sys
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from loraflow.errors import LoraflowError
from loraflow.explain.prefix import strip_prefix

if TYPE_CHECKING:
    from loraflow.explain.own import OwnLog

MAX_LINES, MAX_LINE_CHARS = 20_000, 2_000

# A traceback frame as Python prints it (`File "x.py", line 9, in f`), as rich prints it (`/x.py:9 in f`, LLaMA-Factory
# and others install rich tracebacks), as pytest prints it (`x.py:9: in f`) and as IPython / Jupyter / VS Code
# notebooks print it (`File /x.py:9, in Trainer.train(self, ...)`).
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>.]+)|([\w./\\~:-]+\.py):(\d+)[:,]? in ([\w<>.]+)')
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ENTITY = re.compile(r"&(?:#39|#x27|quot|gt|lt|amp);")
# rich wraps a long frame: `│ /x/utils.py:825 in            │` then `│ get_only_unique_item  │` on the next line.
_RICH_WRAPPED = re.compile(r"([\w./\\~:-]+\.py):(\d+) in\W*$")
# An exception line: `RuntimeError: ...`, `torch.utils.checkpoint.CheckpointError: ...`, a bare `AssertionError`,
# after any `[rank0]:` style prefix, and Ray's wrapper of a remote failure, which names the cause's class in
# parentheses (ray/exceptions.py, RayTaskError.as_instanceof_cause: `ray.exceptions.RayTaskError(KeyError): ray::
# ActorModelRayActor.fit() ...`, the line OpenRLHF's and verl's drivers end on). Warnings (`UserWarning: ...`) are
# not errors.
_ERROR = re.compile(r"^\W*((?:[A-Za-z_][\w]*\.)*[A-Za-z_]*(?:Error|Exception|Interrupt)(?:\([\w.]+\))?|"
                    r"AssertionError|KeyboardInterrupt|SystemExit)(?::\s?(.*))?$")
# What a launcher prints once a worker has failed, below the worker's own error: its own traceback (torchrun's
# elastic agent, accelerate launch, the deepspeed runner, a CLI that runs torchrun in a subprocess) and its summary
# error. It says that a process failed, never why: left out of the frames and errors explain reads.
_LAUNCHER_FRAME = re.compile(r"torch[/\\]distributed[/\\](?:run\.py|launch\.py|launcher[/\\]|elastic[/\\])|"
                             r"accelerate[/\\]commands[/\\]|deepspeed[/\\]launcher[/\\]|[/\\]subprocess\.py$|"
                             r"(?:^|[/\\])bin[/\\](?:torchrun|accelerate|deepspeed|llamafactory-cli|swift)$|"
                             r"swift[/\\]cli[/\\](?:main|_?base)\.py|llamafactory[/\\]cli\.py")
_LAUNCHER_ERROR = re.compile(r"(?:^|\.)ChildFailedError\b|\bCalledProcessError: Command .* returned non-zero exit "
                             r"status|^SystemExit\b")
_WARNING = re.compile(r"\b\w*Warning\b:|\[W(?:\s|\d)|\bWARNING\b|\bwarn(?:ing)?s?\.warn", re.IGNORECASE)
_PACKAGES = {"torch": r"torch|pytorch", "deepspeed": r"deepspeed", "transformers": r"transformers",
             "peft": r"peft", "bitsandbytes": r"bitsandbytes", "accelerate": r"accelerate", "trl": r"trl"}
_VERSION = r"(\d+\.\d+(?:\.\d+)?(?:\.?(?:post|dev|rc)\d+)?)"


@dataclass
class Frame:
    line_no: int
    path: str
    function: str

    @property
    def where(self) -> str:
        return f"{self.path.replace(chr(92), '/')}:{self.function}"

    @property
    def wheres(self) -> tuple[str, ...]:
        """`where`, and where the name is qualified (IPython and Jupyter print `Linear8bitLt.forward`,
        `LoraModel.merge_and_unload`, `add_hook_to_module.<locals>.new_forward`) also the form with the bare function
        name, which is what the rules' raise-path patterns name (`lora.py:forward$`)."""
        bare = self.function.rsplit(".", 1)[-1]
        return (self.where,) if bare == self.function else (self.where, f"{self.path.replace(chr(92), '/')}:{bare}")


@dataclass
class LogView:
    lines: list[str]
    text: str
    frames: list[Frame] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    """(line number, text) of each exception line."""
    versions: dict[str, Version] = field(default_factory=dict)
    inferred: set[str] = field(default_factory=set)
    """Packages whose version was read from the traceback's line numbers rather than printed."""
    own: OwnLog | None = None
    """What loraflow itself said, in a log a loraflow run wrote (explain/own.py); None for other logs."""
    launch: tuple[Any, str] | None = None
    """(build, label): the run's launch given beside the log (`explain --launch FILE`), built as `check` builds a
    setup (a function of the versions to a FrontendResult); None when only the log is given."""

    @property
    def final_error(self) -> tuple[int, str] | None:
        return self.errors[-1] if self.errors else None

    @property
    def truncated(self) -> bool:
        """The log stops inside a traceback: frames after the last error line, and no error line after them. Not
        where every rank prints the failure (`[rank0]: ...`, `[rank7]: ...`) and the paste stops inside one rank's
        copy after another rank printed its error line: the failure's error line is in the log (ms-swift#1574's
        rank0 ValueError then rank7's cut traceback; trl#2600's rank2 IndexError before rank0's)."""
        if not self.frames:
            return False
        last_frame = self.frames[-1].line_no
        if any(n > last_frame for n, _ in self.errors):
            return False
        rank = _rank(self.lines[last_frame - 1])
        return rank is None or not any(_rank(self.lines[n - 1]) not in (None, rank) for n, _ in self.errors)

    @property
    def one_liner(self) -> bool:
        return sum(1 for line in self.lines if line.strip()) <= 3

    @property
    def shape(self) -> str:
        if self.own is not None and self.own.fatal is not None and self.own.fatal.own:
            return "loraflow-error"
        if self.truncated:
            return "truncated"
        if not self.errors and any("recomputed metadata" in line for line in self.lines):
            return "metadata-only"
        if self.one_liner:
            return "one-liner"
        if not self.errors:
            return "warning-only" if any(_WARNING.search(line) for line in self.lines) else "no-error"
        return "full"


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


def log_versions(text: str) -> dict[str, Version]:
    """Package versions a log prints: `DeepSpeed info: version=0.15.3`, ds_report's dot leaders, `torch==2.5.1`,
    `- PyTorch version (GPU?): 2.1.2+cu118`, `- `transformers` version: 4.40.0`, `deepspeed-0.15.3.dist-info`."""
    found: dict[str, Version] = {}
    for package, names in _PACKAGES.items():
        patterns = (rf"(?i)\b(?:{names})\s+info:\s*version\s*=\s*{_VERSION}",
                    rf"(?i)\b(?:{names})\s+(?:version|info)\s*\.{{3,}}\s*v?{_VERSION}",
                    rf"(?i)(?<![\w/.-])`?(?:{names})`?(?:\s+version)?(?:\s*\([^)]*\))?\s*(?:==|:|=|\s)\s*v?{_VERSION}\b",
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


# torch's checkpoint.py moves between releases: the line of `unpack_hook`'s call to check_recomputed_tensors_match
# dates a traceback that prints no version (stock wheels; 2.5/2.6 and 2.10/2.11 share lines: the older is taken,
# and 2.10/2.11 straddles a rule boundary, so it is left out).
_CHECKPOINT_LINES = {1075: "2.1.0", 1116: "2.2.0", 1126: "2.3.0", 1120: "2.4.0", 1129: "2.5.0", 1128: "2.7.0",
                     1150: "2.8.0", 1158: "2.9.0", 1171: "2.12.0", 1187: "2.13.0", 1373: "2.14.0"}


_RANK_PREFIX = re.compile(r"^\s*\[rank(\d+)\]:")


def _rank(line: str) -> str | None:
    """The rank a `[rankN]: ` record prefix names (torchrun's --local-ranks-filter / tee output), None without one."""
    m = _RANK_PREFIX.match(line)
    return m.group(1) if m else None


# A rank's record prefix (`[rank1]: `) inside a line: several ranks' records written or pasted without their line
# breaks (`[rank0]: saved met[rank1]: Traceback ...[rank1]:   File ...`).
_GLUED_RANK = re.compile(r"(?<=\S)(?=\[rank\d+\]:)")


def _unglue(lines: list[str]) -> list[str]:
    """Lines holding several ranks' records split back into one record a line, so that every frame on them is read
    (a line yields one frame). Only lines with two or more rank prefixes, the first at the line's start."""
    out: list[str] = []
    for line in lines:
        if line.lstrip().startswith("[rank") and len(_GLUED_RANK.findall(line)) >= 1 and line.count("[rank") >= 2:
            out.extend(_GLUED_RANK.split(line))
        else:
            out.append(line)
    return out


def view(text: str) -> LogView:
    """The last MAX_LINES lines of the log, each cut to MAX_LINE_CHARS: failures end a log, and the cap keeps a 100 MB
    training log or a megabyte-long line from making the regular expressions crawl."""
    # A log kept in a JSON string: its newlines are `\n` (three or more; or any, on a paste with no line break at all,
    # as a two-line error kept so is)
    escaped = text.count("\\n")
    if text.count("\n") < 3 and (escaped >= 3 or (escaped and "\n" not in text.strip())):
        text = text.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", "    ").replace('\\"', '"')
    lines = [_ANSI.sub("", line)[:MAX_LINE_CHARS] for line in _unglue(text.splitlines())[-MAX_LINES:]]
    if _ENTITY.search(text):  # copied from a page's source: `&#39;` and `&gt;` stand for the characters printed
        lines = [html.unescape(line) for line in lines]
    log = LogView(lines=lines, text="\n".join(lines))
    for i, line in enumerate(lines, 1):
        wrapped = _RICH_WRAPPED.search(line)
        if wrapped and i < len(lines):
            name = re.match(r"\W*([\w<>.]+)", lines[i])
            if name:
                log.frames.append(Frame(i, wrapped.group(1), name.group(1)))
                continue
        m = _FRAME.search(line)
        if m:
            path, function = (m.group(1), m.group(3)) if m.group(1) else (m.group(4), m.group(6))
            if not _LAUNCHER_FRAME.search(path):
                log.frames.append(Frame(i, path, function))
            continue
        bare = strip_prefix(line).strip()
        if _ERROR.match(bare) and not _LAUNCHER_ERROR.search(bare):
            log.errors.append((i, bare[:400]))
    log.versions = log_versions(log.text)
    if "torch" not in log.versions:
        m = re.search(r'torch[/\\]utils[/\\]checkpoint\.py", line (\d+), in unpack_hook\b', log.text)
        if m and int(m.group(1)) in _CHECKPOINT_LINES:
            log.versions["torch"] = Version(_CHECKPOINT_LINES[int(m.group(1))])
            log.inferred.add("torch")
    return log
