"""Launch scripts read for their launch line: variables assigned and expanded as bash would (defaults,
`${VAR:-x}`, `$(expr ...)`, `$((...))`, heredocs), comments and `case` arms left out, lines joined at `\\`; the
first line that starts a launcher or a training program is the command (argv.split_command then reads it), unless
its name calls it a data step (`prepare_data.py`), which gives way to the next line that trains.
Split from argv.py, which parses the command itself."""

from __future__ import annotations

import re
import shlex
from contextvars import ContextVar
from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.frontends.cluster import slurm_environment
from loraflow.frontends.shell_blocks import ONE_LINE_IF, Branches, if_lines, one_word_substitutions

SCRIPT_DIRS: ContextVar[tuple[Path, ...]] = ContextVar("script_dirs", default=())
"""The folders of the launch scripts read in this check, nearest first with up to three of their parents: a script in
`repo/scripts/` names `configs/ds.json` as seen from `repo/`, where it is run from (argv.resolve_path looks there
after the working directory)."""

# Shared with argv.py, which imports them from here (this module imports nothing of argv's).
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)*)?$")
_STARTS = ("deepspeed", "torchrun", "accelerate", "llamafactory-cli", "lmf", "swift", "axolotl", "trl", "tune", "ray",
           "litgpt", "megatron", "srun", "mpirun", "mpiexec", "vllm", "lm_eval")
# Commands that run the rest of their line (`nohup torchrun ...`, `apptainer exec --nv img.sif accelerate launch ...`,
# `conda run -n env python ...`): their own options and operands come before the launcher, which is read from there.
# `timeout 2400 ...` and `nsys profile --trace=cuda ... python ...` (SLURM jobs, profiling runs) wrap it the same way.
# `eval $CMD` (a launch line built in a variable, then evaluated) runs the words after it the same way.
_WRAPPERS = ("nohup", "time", "timeout", "nsys", "exec", "eval", "env", "nice", "ionice", "stdbuf", "taskset",
             "numactl", "unbuffer", "apptainer", "singularity", "conda", "mamba", "micromamba", "uv", "poetry",
             "pipenv")
# A value may join quoted and bare parts, as bash does (`L="accelerate launch --main_process_ip "$ADDR" --x 1"`), and
# hold `${X:="train.py"}` (a default with quotes of its own inside the braces).
_ASSIGN = re.compile(r"""^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=((?:"[^"]*"|'[^']*'|\$\{[^}\s]*\}|[^\s"'#])*)"""
                     r"""\s*(?:#.*)?$""")
_QUOTED = re.compile(r""""([^"]*)"|'([^']*)'""")
_MULTILINE_ASSIGN = re.compile(r'(?m)^(\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*\+?=)"([^"]*\n[^"]*)"')
# `${X:-default}`, and `${X:=default}` / `${X-default}` (bash gives the default the same way when X is unset; SLURM
# scripts write `${SLURM_JOB_NUM_NODES:=1}`, `training_script=${training_script:="train.py"}`).
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|\d+)(?::?[-=]([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*|\d|@|\*)")
_HEREDOC = re.compile(r"^[ \t]*(?:read\s+(?:-\w+\s+(?:''\s+)?)*(?P<var>[A-Za-z_]\w*)|(?P<var2>[A-Za-z_]\w*)=\$\(cat)\s*"
                      r"<<-?\s*['\"]?(?P<tag>\w+)['\"]?[^\n]*\n(?P<body>.*?)^[ \t]*(?P=tag)\b[^\n]*\n?", re.M | re.S)
# `$(expr 16 / $nproc_per_node)` (ms-swift's and others' example scripts): the same integer arithmetic as `$((...))`,
# read as one word rather than split into `$(expr`, `16`, `/`... positional arguments.
_CASE = re.compile(r"^case\s.+\sin\b")
# Bash arrays (`CMD=(swift rlhf --rlhf_type grpo ...)`, `ARGS+=(--lora_rank 16)`, then `"${CMD[@]}"`): RL scripts build
# their trainer's flags in one and add to it by branch; `${#ARR[@]}` is its length.
_ARRAY_START = re.compile(r"(?m)^[ \t]*(?:(?:local|declare|typeset)(?:[ \t]+-a)?[ \t]+)?[A-Za-z_]\w*\+?=\(")
_ARRAY_ASSIGN = re.compile(r"^\s*(?:(?:local|declare|typeset)(?:\s+-a)?\s+)?([A-Za-z_]\w*)(\+?)=\((.*)\)\s*(?:#.*)?$")
_ARRAY_USE = re.compile(r"\"?\$\{(#?)([A-Za-z_]\w*)\[[@*]\]\}\"?")
_EXPR = re.compile(r"\$\(\s*expr\s+([^()]*)\)")
# `OUT="runs/x_$(date +%Y%m%d_%H%M%S)"`: bash runs the command when it assigns, and its output (a date, a path) is
# one word; kept as written, the space inside would split `--output_dir $OUT` into a stray positional argument.
_SUBST = re.compile(r"\$\((?!\()[^()]*\)")
# A pipeline script runs `python scripts/prepare_data.py` (or a download, tokenizing, profiling step) before its
# training line: a program whose name says it is such a step gives way to the next launch line that is not an
# evaluation, export or merge (`accelerate launch -m lm_eval` after training is not the run). Names are matched as
# words of the file or module name (`retrieval` holds no `eval`, `constraints` no `train`).
_DATA_STEP = re.compile(r"(?:^|[_\-.])(?:prepare|preprocess|process|data|dataset|download|tokeni[sz]e|profile|convert|"
                        r"build|make|gen|split|filter)(?:$|[_\-.])", re.I)
_TRAINS = re.compile(r"(?:^|[_\-.])(?:train|training|finetune|fine_tune|finetuning|sft|dpo|grpo|ppo|rlhf|lora|qlora|"
                     r"distill)(?:$|[_\-.])", re.I)
_NOT_TRAINING = re.compile(r"(?:^|[_\-.])(?:merge|export|eval|evaluate|evaluation|infer|inference|predict|serve|test|"
                           r"generate|plot|benchmark|bench)(?:$|[_\-.])", re.I)
# RL scripts start the rollout server before the trainer (`trl vllm-serve ... &`, `swift rollout`, `python -m
# trl.scripts.vllm_serve`, vLLM's or SGLang's OpenAI server) and bring up the Ray cluster before submitting the job
# (`ray stop`, `ray start --head`): neither is the run, so the training line after them is read.
_SERVERS = re.compile(r"(?:^|\.)(?:vllm_serve|api_server|launch_server|launch_router)$")
_SETUP_MODULES = ("pip", "ensurepip", "venv", "spacy", "nltk", "huggingface_hub", "site", "wandb")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed", "deepspeed.launcher.runner",
                     "accelerate.commands.launch")
# Subcommands of the frameworks' CLIs that fetch, copy or check before the run, or use its result after it.
_CLI_SETUP = {"tune": ("download", "cp", "ls", "validate", "cat"), "litgpt": ("download",)}
_CLI_AFTER = {"tune": ("run_eval",), "litgpt": ("merge_lora", "evaluate", "chat", "generate"),
              "llamafactory-cli": ("export", "chat", "webchat", "eval"), "swift": ("export", "infer", "eval")}
_CLI_SERVERS = {"trl": ("vllm-serve", "vllm_serve"), "swift": ("rollout", "deploy", "app", "web-ui"),
                "vllm": ("serve",), "lmdeploy": ("serve",)}

def _arithmetic(line: str, variables: dict[str, str]) -> str:
    """`$((A / (B * C)))` replaced by its value where every name in it has a numeric value (bash integer
    arithmetic), else kept as one unexpanded word (`$((SLURM_NNODES*8))`), so it cannot split into stray positional
    arguments and a process count computed from what the script does not set reads as not visible, not as 0."""
    out, i = [], 0
    while (start := line.find("$((", i)) >= 0:
        depth, j = 2, start + 3
        while j < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            j += 1
        expr = re.sub(r"\$?\{?([A-Za-z_]\w*)(?::?[-=]([^}]*))?\}?",
                      lambda m: variables.get(m.group(1), m.group(2) or "x"), line[start + 3:j - 2])
        value = "$((" + "".join(line[start + 3:j - 2].split()) + "))"
        if re.fullmatch(r"[\d\s+\-*/%()]+", expr):
            try:  # digits and operators only (checked above); bash's `/` is integer division
                value = str(int(eval(expr.replace("/", "//"), {"__builtins__": {}})))  # noqa: S307
            except (ArithmeticError, SyntaxError):
                pass
        out.append(line[i:start] + value)
        i = j
    return "".join(out) + line[i:]


def _launcher_at(words: list[str]) -> int | None:
    """Where the launcher starts in a line's words: after `VAR=value` prefixes, and past a wrapper command with its
    options and operands (an image, an environment's name); None when the line runs something else."""
    wrapped = False
    for i, word in enumerate(words):
        if Path(word).name in _STARTS or _PYTHON.match(word) or (wrapped and word.endswith(".py")):
            return i
        if _interpreter_variable(words, i):
            return i
        if Path(word).name in _WRAPPERS:
            wrapped = True
        elif not wrapped and not _ENV.match(word):
            return None
    return None


def _interpreter_variable(words: list[str], i: int) -> bool:
    """`$VENV_PYTHON -m openrlhf.cli.train_ppo_ray ...`, `${PY} train.py`: a variable the script does not set (its
    environment does) run with `-m MODULE` or a .py file is a Python interpreter."""
    return bool(re.fullmatch(r"([\"']?)\$\{?[A-Za-z_]\w*\}?\1", words[i])) and i + 1 < len(words) and (
        words[i + 1] == "-m" or words[i + 1].endswith(".py"))


def _launch_in(line: str) -> list[str]:
    """The launch command on one expanded line, if any: the line split into the commands it chains (`cd repo &&
    torchrun ...`, `source activate env; python ...`), assignments alone before `&&` carried to the next command,
    redirections and a trailing `&` dropped."""
    env: list[str] = []
    for segment in _chained(one_word_substitutions(_strip_comment(line))):
        body = re.split(r"\s(?:&>|2>&1|>>|>|\||&)(?:\s|$)", " " + segment + " ")[0]
        words = body.split()
        if words and all(_ENV.match(w) for w in words):
            env += words
            continue
        if _launcher_at(words) is None:
            env = []
            continue
        try:
            tokens = shlex.split(body)
        except ValueError:  # a quote left open (a line cut where it was pasted): its words as written
            tokens = words
        at = _launcher_at(tokens)
        if at is not None:  # the `VAR=value` words before a wrapper still reach the launcher
            wrapper = next((i for i, t in enumerate(tokens[:at]) if Path(t).name in _WRAPPERS), at)
            # `uv run sft.py` (uv runs a .py file with the project's python): the python is implied.
            python = ["python"] if tokens[at].endswith(".py") else []
            if _interpreter_variable(tokens, at):
                tokens[at] = "python"
            return env + tokens[:wrapper] + python + tokens[at:]
    return []


def _chained(line: str) -> list[str]:
    """The commands a line chains with `&&`, `||` or `;`, split outside quotes."""
    parts, quote, start, i = [], "", 0, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif line.startswith(("&&", "||"), i) or ch == ";":
            parts.append(line[start:i])
            i += 1 if ch == ";" else 2
            start = i
            continue
        i += 1
    return parts + [line[start:]]


def _strip_comment(line: str) -> str:
    """The line up to a shell comment: a `#` that starts a word outside quotes (bash's rule; `a#b`, `"#### 42"` and
    `--dataset name#5000` keep theirs, which shlex's own comment handling would cut)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _joined(text: str, variables: dict[str, str]) -> str:
    """The script's text with its here-documents taken into `variables`, continued lines joined, and a quoted value
    or an array over several lines put on one."""
    # `read -r -d '' VAR <<EOF ... EOF` (OpenRLHF's example scripts) and `VAR=$(cat <<EOF ... EOF)` hold the
    # training flags in a here-document: its body becomes the variable's value.
    for m in _HEREDOC.finditer(text):
        variables[m.group("var") or m.group("var2")] = " ".join(re.sub(r"\\\s*$", "", line).strip()
                                             for line in m.group("body").splitlines())
    text = _HEREDOC.sub("", text)
    # A comment line's trailing `\\` is part of the comment (bash ends a comment at the newline): `#--x \\` above the
    # launch line does not swallow it.
    text = re.sub(r"(?m)^(\s*#.*?)\\\s*$", r"\1", text)
    joined = re.sub(r"\\\s*\n", " ", text)
    # A quoted value over several lines (`DISTRIBUTED_ARGS="` newline `--nproc_per_node 8` newline `"`) is one value.
    joined = _MULTILINE_ASSIGN.sub(lambda m: f'{m.group(1)}"{" ".join(m.group(2).split())}"', joined)
    return _one_line_arrays(joined)


def _one_line_arrays(text: str) -> str:
    """`ARGS=(` newline `--model x` newline `)`: an array's elements over several lines (comments between them left
    out) on one line, as _ARRAY_ASSIGN reads it."""
    out, i = [], 0
    for m in _ARRAY_START.finditer(text):
        if m.start() < i:
            continue
        depth, quote, j = 1, "", m.end()
        while j < len(text) and depth:
            ch = text[j]
            if quote:
                quote = "" if ch == quote else quote
            elif ch == "#" and text[j - 1] in " \t\n(":  # a comment runs to the line's end, quotes in it too
                j = text.find("\n", j)
                j = len(text) if j < 0 else j
                continue
            elif ch in "'\"":
                quote = ch
            else:
                depth += {"(": 1, ")": -1}.get(ch, 0)
            j += 1
        body = " ".join(_strip_comment(line).strip() for line in text[m.end():j - 1].split("\n"))
        out.append(text[i:m.start()] + m.group(0) + " ".join(body.split()) + ")")
        i = j
    return "".join(out) + text[i:]


def _unset(m: re.Match) -> str:
    """An unset variable: its `${X:-default}`, else nothing for positional parameters ($1, $@: the script run
    without arguments), else the name itself, so that a launcher's `$DISTRIBUTED_ARGS` stays visible as unknown."""
    name = m.group(1) or m.group(3)
    if m.group(2) is not None or name.isdigit() or name in ("@", "*"):
        return m.group(2) or ""
    return f"${name}"


# A launch pasted from an issue or a terminal: markdown fences, Windows line ends, a shell prompt before the command
# (`$ torchrun ...`, `(venv) user@host:~/x$ torchrun ...`, `root@a1b2:/w# deepspeed ...`).
_FENCE = re.compile(r"(?m)^\s*```.*$")
PROMPT = re.compile(r"^\s*(?:\([\w.-]+\)\s*)?(?:[\w.@:~/-]*\$|[\w.-]+@[\w.-]+:[^\s#]*#)\s+(?=\S)")


def _as_pasted(text: str) -> str:
    text = _FENCE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return "\n".join(PROMPT.sub("", line, count=1) for line in text.split("\n"))


def command_from_script(path: str) -> list[str]:
    """The launch line of a shell script: line continuations joined, simple `VAR=value` assignments expanded
    (the last assignment wins, so `if [ -z "$X" ]; then X=3; fi` style defaults come through), redirections dropped.
    Positional parameters ($1, $2, $@, ${1:-default}) expand to nothing or their default, as when the script runs
    without arguments."""
    text = _as_pasted(_read_script(path))
    here = Path(path).resolve().parent
    SCRIPT_DIRS.set(tuple(dict.fromkeys((*SCRIPT_DIRS.get(), here, *list(here.parents)[:3]))))
    # What `#SBATCH --nodes=2 --gres=gpu:8` puts in the job's environment (SLURM_NNODES...), which the launch
    # line reads; the script's own assignments below override it.
    job_env = slurm_environment(text)
    variables: dict[str, str] = dict(job_env)
    arrays: dict[str, str] = {}
    joined = ONE_LINE_IF.sub(if_lines, _joined(text, variables))

    def expand(s: str) -> str:
        s = re.sub(r'"\$\{?[@*]\}?"', "$@", s)  # `"$@"` of a script run without arguments is no word at all
        s = _ARRAY_USE.sub(lambda m: str(len(shlex.split(arrays.get(m.group(2), ""), posix=True))) if m.group(1)
                           else arrays.get(m.group(2), ""), s)
        return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(3), _unset(m)), s)

    cases = 0  # inside `case ... esac`: arms that run only for a matching argument (none, run without arguments)
    # `export CUDA_VISIBLE_DEVICES=0,1` on a line of its own reaches the launch's environment as an inline
    # `VAR=value` does (bash passes exported variables to the commands it starts); the others stay the shell's.
    exported: list[str] = list(job_env)
    # What a line is decides whether it is the run (_line_kind); the steps before the run are held, in this order
    # of preference, for a script whose run is one of them.
    held: dict[str, list[str] | None] = {"plain": None, "data": None, "after": None, "server": None, "setup": None}
    branches = Branches()
    lines = joined.splitlines()
    for at, line in enumerate(lines):
        line = _EXPR.sub(lambda m: "$((" + m.group(1).replace("\\*", "*") + "))", line)
        line = _arithmetic(line, variables) if "$((" in line else line
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        cases += bool(_CASE.match(stripped)) - bool(re.match(r"esac\b", stripped))
        if array := _ARRAY_ASSIGN.match(_strip_comment(line)):
            # `ARGS=(--a 1 --b "$X")`, `ARGS+=(...)`: expanded as bash does when it assigns (quotes kept, so each
            # element stays one word), then put in where `"${ARGS[@]}"` is used.
            value = expand(array.group(3))
            arrays[array.group(1)] = (arrays.get(array.group(1), "") + " " if array.group(2) else "") + value
            continue
        branches.see(stripped)
        assign = _ASSIGN.match(line)
        if assign and cases > 0:
            continue  # `-m | --model ) shift; MODEL=$1 ;;` (Qwen's finetune scripts) does not run without arguments
        if assign:
            _take_assignment(assign, line, expand, variables, exported, branches)
            continue
        # `export A B` after `A=1`, and `export A=1 B=2` (plain values; a quoted one is the assignment's line above)
        if re.match(r"export(\s+[A-Za-z_]\w*(=[^\s\"'$`]*)?)+$", stripped):
            for word in stripped.split()[1:]:
                name, eq, value = word.partition("=")
                variables.update({name: value} if eq else {})
                exported += [name] if name not in exported else []
            continue
        # A notebook cell saved as text: `!swift sft ...` runs the rest of the line in a shell (IPython).
        stripped = stripped[1:] if stripped.startswith("!") else stripped
        tokens = _launch_in(expand(stripped))  # `$LAUNCHER train.py` with LAUNCHER=torchrun set above
        if not tokens:
            continue
        tokens = [f"{k}={variables[k]}" for k in exported if k in variables] + tokens
        kind = _line_kind(tokens)
        if kind == "run":
            run = _cut_by_comment(tokens, lines[at + 1:])
            run.notes = run.notes + branches.about(stripped) + _later_runs(lines[at + 1:], expand, branches)
            run.started = [" ".join(held["server"])] if held["server"] else []
            return run
        if kind in held:  # a step before or after the run: the first of each kind is kept in case no run follows
            held[kind] = held[kind] or tokens
    if any(held.values()):
        return next(t for t in held.values() if t)
    raise LoraflowError(f"{path}: found no launch line (a line starting with deepspeed, torchrun, accelerate launch, "
                        "python, llamafactory-cli, swift, axolotl, trl, srun or mpirun).")


def _take_assignment(assign: re.Match, line: str, expand, variables: dict[str, str], exported: list[str],
                     branches: Branches) -> None:
    """`VAR=value` / `VAR+=value` (`export` too), read as bash assigns it, within the `if` branches it is in."""
    name, added, stripped = assign.group(1), _assigned(assign, expand), line.strip()
    # `ARGS="$ARGS --x"` adds to ARGS; `NPROC=${NPROC:-8}` only gives it a default.
    adds = bool(assign.group(2)) or re.match(rf"\$(?:\{{{name}\}}|{name}\b)\s*\S", assign.group(3).strip("\"'")) \
        is not None
    if adds and not branches.reads(name, stripped):
        return
    if not adds:
        branches.assigned(name, stripped)
    variables[name] = variables.get(name, "") + added if assign.group(2) else added
    exported += [name] if re.match(r"\s*export\s", line) and name not in exported else []


def _later_runs(rest: list[str], expand, branches: Branches) -> list[str]:
    """A script that trains more than once (LLaVA-style stage 1 then stage 2, SFT then DPO): check reads the first
    run; the others are named so they can be checked on their own. A run in another branch of the `if` chain the
    read run is in is an alternative to it, not a second run."""
    here = branches.path()
    later, instead = [], []
    for line in rest:
        stripped = line.strip()
        branches.see(stripped)
        if stripped and not stripped.startswith("#") and not _ASSIGN.match(line):
            tokens = _launch_in(expand(stripped))
            if tokens and _line_kind(tokens) == "run":
                there = dict(branches.path())
                other = any(block in there and there[block] != branch for block, branch in here)
                (instead if other else later).append(" ".join(tokens[:6]) + (" ..." if len(tokens) > 6 else ""))
    notes = [f"the launch read runs only in its branch of an `if`; another branch runs instead: "
             + "; ".join(f"`{t}`" for t in instead)] if instead else []
    if later:
        notes.append(f"the script trains {len(later) + 1} times; check reads the first launch. Later: "
                     + "; ".join(f"`{t}`" for t in later) + " (check one by passing its line after `--`)")
    return notes


def _read_script(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise LoraflowError(f"cannot read the launch script {path} (from {Path.cwd()}): {exc.strerror}. check reads "
                            "its launch line: run check where the script is, or paste that line after `--`.") from None


def _assigned(assign: re.Match, expand) -> str:
    """The value a `VAR=value` (or `VAR+=value`) line assigns: quotes removed, variables expanded, and a command
    substitution kept as one word."""
    value = expand(_QUOTED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), assign.group(3)))
    return _SUBST.sub(lambda m: "".join(m.group(0).split()), value)


class ScriptLine(list):
    """A script's launch line, with what check should tell about how bash reads it (`notes`) and the server it
    starts before it (`started`)."""
    notes: list[str] = []
    started: list[str] = []


def _cut_by_comment(tokens: list[str], rest: list[str]) -> list[str]:
    """A comment line inside a continued command (`--model x \\` newline `#--model y \\` newline `--lr 1e-5 \\`)
    ends the command: bash stops the comment at its newline, so the flags after it are a command of their own
    (`--lr: command not found`) and never reach the launch. Read as bash runs it, and said so."""
    following = next((line.strip() for line in rest if line.strip() and not line.strip().startswith("#")), "")
    line = ScriptLine(tokens)
    if following.startswith("-"):
        flags = [w for w in following.split() if w.startswith("-")][:3]
        line.notes = [f"a comment line inside the launch command ends it (bash ends a comment at its newline, its "
                      f"`\\` included): {', '.join(flags)} and the lines after it are not passed to the launch, and "
                      "bash runs them as a command of their own, which fails; the launch is read as bash runs it"]
    return line


def _line_kind(tokens: list[str]) -> str:
    """What a launch line is, by its command and its program's name (matched as words: `retrieval` holds no `eval`):
    "cluster" (`ray start`, `ray stop`: skipped), "server" (a rollout or inference server started beside the
    trainer), "setup" (`python -c ...`, `python -m pip ...`), "data" (a step its name calls data preparation), "plain"
    (a plain `python x.py` whose name says nothing of training: the run unless a launcher's line follows), "after"
    (an evaluation, plot or merge: the run only when no other line is), else "run"."""
    words = [t for t in tokens if not _ENV.match(t)]
    head, second = Path(words[0]).name if words else "", words[1] if len(words) > 1 else ""
    if len(words) <= 3 and words[-1:] in (["-h"], ["--help"], ["--version"]):
        return "setup"  # `accelerate launch -h` printed before the run (open-instruct's scripts)
    if head == "ray":
        return "run" if second == "job" else "cluster"
    if second in _CLI_SERVERS.get(head, ()) or _SERVERS.search(_program(tokens)):
        return "server"
    if second in _CLI_SETUP.get(head, ()) or (head in _CLI_SETUP and second.startswith("convert")):
        return "setup"  # `tune download ...` / `litgpt download ...` fetch the weights before the run
    if second in _CLI_AFTER.get(head, ()) or head == "lm_eval":  # lm-evaluation-harness scores a trained model
        return "after"
    python = bool(_PYTHON.match(head))
    module = words[words.index("-m") + 1] if python and "-m" in words[:-1] else ""
    if python and ("-c" in words[1:2] or module.split(".")[0] in _SETUP_MODULES or module == "torch.utils.collect_env"):
        return "setup"
    name = _program(tokens)
    if _DATA_STEP.search(name) and not _TRAINS.search(name):
        return "data"
    if _NOT_TRAINING.search(name):
        return "after"
    if python and module not in _LAUNCHER_MODULES and not _TRAINS.search(name):
        return "plain"
    return "run"


def _program(tokens: list[str]) -> str:
    """What a launch line runs: its script's name, else the module after -m (`lm_eval`, `axolotl.cli.train`)."""
    script = next((Path(t).stem for t in tokens if t.endswith(".py")), "")
    module = next((b for a, b in zip(tokens, tokens[1:]) if a in ("-m", "--module")), "")
    return script or module


def is_launch_script(path: str) -> bool:
    """A launch script under a config's name (a `.yaml` or `.txt` holding `#!/bin/bash` and `accelerate launch
    src/train_bash.py ...`, as issues paste them): its first line is a shebang, or it is no YAML/JSON mapping and has
    a launch line. A config that does not parse and has no launch line keeps its own error (which names the line)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first.startswith("#!"):
        try:
            if isinstance(yaml.safe_load(text), dict):  # JSON is YAML too
                return False
        except yaml.YAMLError:
            pass
    try:
        return bool(command_from_script(path))
    except LoraflowError:
        return False
