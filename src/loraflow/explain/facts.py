"""The facts of one log: the named patterns of rules/signs.py, plus what the numbers in some messages say.

The checkpoint's metadata dump is read pair by pair: how the recomputed tensor differs from the saved one names the
mechanism (a shape that became [0] is a released ZeRO-3 partition; the same shape in another precision is a skipped
mixed-precision cast; a dimension that grew is a KV cache written twice; one divided by a whole factor is a sequence
split across ranks). The verdict comes from the difference, not from which words happen to appear in the log.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from loraflow.explain.logread import _LAUNCHER_ERROR, _LAUNCHER_FRAME, LogView
from loraflow.explain.prefix import strip_prefix
from loraflow.rules.signs import COMPILED_FACTS

# torch prints `'shape': torch.Size([1024])`; a hand-shortened paste `'shape': [1024]`.
_SHAPE = re.compile(r"'shape':\s*(?:torch\.Size\()?\[([\d,\s]*)\]")
_DTYPE = re.compile(r"'dtype':\s*torch\.(\w+)")
_HALF = {"bfloat16", "float16", "half", "bf16", "fp16"}
_FLOAT = {"float32", "float"}
_INTS = {"uint8", "int8", "int16", "int32", "int64", "bool"}
# bitsandbytes packs 4-bit weights two to a byte in torch.uint8 (Params4bit's default quant_storage). Signed integers
# are codes of another scheme: LLM.int8 (Int8Params, torch.int8), int8 post-training quantization (compressed-tensors
# w8a8) or GPTQ/AWQ's packed int32 qweight. FSDP names the dtype only in its uniform-dtype refusal.
_PACKED_4BIT = {"uint8"}


@dataclass
class Tensor:
    shape: tuple[int, ...] | None
    dtype: str | None


@dataclass
class Facts:
    names: set[str] = field(default_factory=set)
    lines: dict[str, tuple[int, str]] = field(default_factory=dict)
    """For structured facts: the line that shows it."""

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def add(self, name: str, line: tuple[int, str] | None = None) -> None:
        self.names.add(name)
        if line is not None and name not in self.lines:
            self.lines[name] = line


def _tensor(line: str) -> Tensor:
    shape = _SHAPE.search(line)
    dtype = _DTYPE.search(line)
    dims = tuple(int(x) for x in shape.group(1).replace(" ", "").split(",") if x) if shape else None
    return Tensor(dims, dtype.group(1) if dtype else None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def pair_verdict(saved: Tensor, recomputed: Tensor) -> str | None:
    """How one recomputed tensor differs from the saved one; None when they agree or the dump is cut."""
    if saved.shape is None or recomputed.shape is None:
        if saved.dtype and recomputed.dtype and saved.dtype != recomputed.dtype:
            return _dtype_verdict(saved.dtype, recomputed.dtype)
        return None
    if saved.shape == recomputed.shape:
        if saved.dtype and recomputed.dtype and saved.dtype != recomputed.dtype:
            return _dtype_verdict(saved.dtype, recomputed.dtype)
        return None
    if _numel(recomputed.shape) == 0 and _numel(saved.shape) > 0:
        return "meta:released-partition"
    if len(saved.shape) == len(recomputed.shape):
        differ = [(s, r) for s, r in zip(saved.shape, recomputed.shape) if s != r]
        if len(differ) == 1:
            s, r = differ[0]
            if r > s:
                return "meta:cache-grown"
            if r > 0 and s % r == 0:
                return "meta:sequence-split"
    return "meta:unexplained"


def _dtype_verdict(a: str, b: str) -> str:
    pair = {a, b}
    if pair & _HALF and pair & _FLOAT:
        return "meta:precision-cast"
    return "meta:unexplained"


def _metadata(log: LogView, facts: Facts) -> None:
    saved: tuple[int, Tensor] | None = None
    for i, line in enumerate(log.lines, 1):
        one_line = re.search(r"\bsaved\b(.*)\brecomputed\b(.*)", line)
        if one_line and "recomputed metadata" not in line:  # `saved {'shape': [1024]} vs recomputed {'shape': [0]}`
            before, after = _tensor(one_line.group(1)), _tensor(one_line.group(2))
            if before.shape is not None and after.shape is not None:
                facts.add("meta:any", (i, line.strip()[:240]))
                verdict = pair_verdict(before, after)
                if verdict:
                    facts.add(verdict, (i, line.strip()[:240]))
                continue
        if "saved metadata" in line:
            saved = (i, _tensor(line))
        elif "recomputed metadata" in line:
            facts.add("meta:any", (i, line.strip()[:240]))
            if saved is None:
                continue
            verdict = pair_verdict(saved[1], _tensor(line))
            if verdict:
                facts.add(verdict, (i, line.strip()[:240]))
            saved = None


def _flatten(log: LogView, facts: Facts) -> None:
    for i, line in enumerate(log.lines, 1):
        if re.search(r"Cannot flatten integer dtype", line):
            facts.add("flatten:int", (i, line.strip()[:240]))
        elif re.search(r"Integer parameters are unsupported", line):
            facts.add("flatten:int", (i, line.strip()[:240]))
        elif re.search(r"(flatten|FlatParameter).{0,60}uniform\W{0,2}dtype|uniform original parameter dtype", line,
                       re.IGNORECASE):
            dtypes = set(re.findall(r"torch\.(\w+)", line))
            name = ("flatten:int" if dtypes & _PACKED_4BIT else "flatten:int-codes" if dtypes & _INTS else
                    "flatten:half-and-float" if dtypes & _HALF and dtypes & _FLOAT else "flatten:other")
            facts.add(name, (i, line.strip()[:240]))
            if "int32" in dtypes:  # GPTQ / AWQ pack eight 4-bit codes per int32: no bitsandbytes layer does
                facts.add("flatten:int32", (i, line.strip()[:240]))


# An image-text model's count of image placeholders in the text against the image features: transformers 4.4x-5
# (`tokens: 2005, features 2695`, or `, tokens: 2, features: 256`) and Gemma3's (`Got 976 image tokens in the text but 1024 tokens from image
# embeddings`). Fewer placeholders than features is a sequence cut inside an image's run of tokens.
_IMAGE_COUNTS = re.compile(r"image tokens do not match[:,] tokens: (\d+), features:? (\d+)|Got (\d+) image tokens in the "
                           r"text but (\d+) tokens from image embeddings", re.IGNORECASE)


def _image_tokens(log: LogView, facts: Facts) -> None:
    for i, line in enumerate(log.lines, 1):
        found = _IMAGE_COUNTS.search(line)
        if found:
            text, features = (int(n) for n in found.groups() if n is not None)
            facts.add("image-tokens:cut" if text < features else "image-tokens:other", (i, line.strip()[:240]))


# DDP's reducer, with TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL, names the parameters that got no gradient:
# `Parameters which did not receive grad for rank 0: a.b.weight, c.d.weight`. A name part of a vision encoder or
# its projector, as the image-text families name them (LLaVA vision_tower/mm_projector/multi_modal_projector, Qwen-VL
# visual/merger, InternVL vision_model/mlp1, MiniCPM-V vpm/resampler, Idefics connector/perceiver, BLIP qformer).
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+:\s*(.+)", re.IGNORECASE)
_VISION_PART = re.compile(r"(?:^|[._])(?:visual|vision\w*|vit|merger|\w*projector|mm_\w+|multi_modal\w*|resampler|vpm|"
                          r"img\w*|image\w*|patch_embed\w*|siglip\w*|clip\w*|mlp1|connector|perceiver\w*|qformer|"
                          r"query_tokens|aligner)(?=[._]|$)", re.IGNORECASE)


def _unused_parameters(log: LogView, facts: Facts) -> None:
    for i, line in enumerate(log.lines, 1):
        found = _UNUSED_NAMES.search(line)
        if not found:
            continue
        names = [n.strip() for n in found.group(1).split(",") if n.strip()]
        if names and not any(_VISION_PART.search(n) for n in names):
            facts.add("ddp:unused-not-vision", (i, line.strip()[:240]))


def read_facts(log: LogView) -> Facts:
    facts = Facts()
    own = _without_launcher(log.text)
    for name, rx in COMPILED_FACTS.items():
        # A launcher's own failure traceback (`accelerate launch`'s CalledProcessError) names accelerate or torchrun
        # in any failed run: it says nothing of whether the run was training.
        if rx.search(own if name == "training" else log.text):
            facts.add(name)
    _metadata(log, facts)
    _flatten(log, facts)
    for i, line in enumerate(log.lines, 1):
        if re.search(r"different number of tensors was saved|Number of tensors saved during forward", line):
            facts.add("recompute:count", (i, line.strip()[:240]))
        sizes = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", line)
        if sizes and {int(sizes.group(1)), int(sizes.group(2))} and max(map(int, sizes.groups())) == 2 * min(
                map(int, sizes.groups())) > 0:
            facts.add("mismatch:doubled", (i, line.strip()[:240]))
    _image_tokens(log, facts)
    _unused_parameters(log, facts)
    if log.truncated:
        facts.add("truncated")
    _launch_lines(log, facts)
    return facts


# A module run with `python -m` counts whatever its name: one no frontend recognises is skipped (check_setup raises),
# so verl's `python3 -m verl.trainer.main_ppo` and OpenRLHF's `-m openrlhf.cli.train_ppo_ray` are read alike; Ray's
# `ray job submit ... -- python3 -m ...` is how OpenRLHF's and verl's example scripts start.
_LAUNCH = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(deepspeed|torchrun|accelerate\s+launch|llamafactory-cli|swift|"
                     r"axolotl|trl|ray\s+job\s+submit|python3?\s+-m\s+[\w.]+|python3?\s+\S+\.py)\s")


# Before the command, as pasted: a markdown quote, a conda env, a shell prompt (`(env) user@host:~$ `), and bash's
# `set -x` trace marker (`+ python3 -m verl.trainer.main_ppo ...`: verl's and OpenRLHF's example scripts set -x).
_PROMPT = re.compile(r"^\s*(?:>\s?)*(?:\([\w.-]+\)\s*)?(?:[\w.@:~/-]*\$\s+|[\w.@:~/-]+#\s+)?(?:\+{1,3}\s+)?")


def _continued(log: LogView, start: int, first: str) -> str:
    """The command that starts on line `start` (1-based) with its text `first`, joined with the lines its trailing
    backslashes continue it on, as the shell joins them: an echoed launch script puts one flag a line
    (`deepspeed main.py \\` / `   --zero_stage 3 \\` / ...)."""
    parts, line, i = [], first.rstrip(), start
    while line.endswith("\\") and i < len(log.lines):
        parts.append(line[:-1].strip())
        line = _PROMPT.sub("", strip_prefix(log.lines[i])).strip()  # a quoted paste quotes every line
        i += 1
    parts.append(line.strip())
    return " ".join(p for p in parts if p)


def _without_launcher(text: str) -> str:
    """The log without a launcher's own traceback frames (and the code line under each) and its summary error."""
    out, skip = [], False
    for line in text.splitlines():
        if skip:
            skip = False
            continue
        frame = re.search(r'File "([^"]+)"', line)
        if frame and _LAUNCHER_FRAME.search(frame.group(1)):
            skip = True
            continue
        if not _LAUNCHER_ERROR.search(line.strip()):
            out.append(line)
    return "\n".join(out)


def _launch_lines(log: LogView, facts: Facts) -> None:
    """A log that echoes its own launch command (many start with it) says what the run set up: read it as `check`
    would, and let each conflict it sets up count for its rule (`setup:ID` holds whatever the versions, `setup?:ID`
    for some of them; the log's own printed versions are used)."""
    from loraflow.errors import LoraflowError
    from loraflow.frontends import from_command
    from loraflow.frontends.shell import _line_kind as line_kind  # what the line is: only a run sets the run up
    from loraflow.frontends.verdict import check_setup

    if log.launch is not None:  # the launch given beside the log: its findings count as an echoed line's would
        build, label = log.launch
        try:
            verdict = check_setup(build, dict(log.versions))
        except (LoraflowError, ValueError, KeyError, IndexError, TypeError):
            verdict = None
        for f in verdict.findings if verdict is not None else ():
            facts.add(("setup:" if f.holds_if is None else "setup?:") + f.rule.id, (0, label))
    for i, raw in enumerate(log.lines[:400], 1):
        # As pasted: after a launcher's or logger's prefix, a markdown quote, or a shell prompt (`(env) user@host:~$ `).
        line = _PROMPT.sub("", strip_prefix(raw))
        if not _LAUNCH.match(line):
            continue
        line = _continued(log, i, line)
        if len(line) < 30:
            continue
        try:
            argv = shlex.split(re.split(r"\s(?:&>|2>&1|>>|>|\|)(?:\s|$)", " " + line.strip() + " ")[0])
            if line_kind(argv) != "run":  # a server, a setup step, an evaluation or merge echoed before the run
                continue
            verdict = check_setup(lambda v, argv=argv: from_command(argv, v), dict(log.versions))
        except (LoraflowError, ValueError, KeyError, IndexError, TypeError):
            continue
        for f in verdict.findings:
            facts.add(("setup:" if f.holds_if is None else "setup?:") + f.rule.id, (i, line.strip()[:240]))
        return
