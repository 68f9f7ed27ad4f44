"""Launch command lines as the shell hands them over: env assignments, launchers, the program, then its flags.

`split_command` peels `CUDA_VISIBLE_DEVICES=0,1`, `deepspeed --num_gpus 2`, `torchrun --nproc_per_node 8`,
`accelerate launch --num_processes 2 --config_file x.yaml`, `python -m`, `ray job submit ... --` and `bash run.sh`
off the front and keeps what each launcher says about the number of processes. `parse_flags` reads the rest
(`--flag value`, `--flag=value`, bare switches, several values after one flag). shell.py's `command_from_script`
finds the launch line in a training script such as DeepSpeed-Chat's `training_scripts/*.sh`.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.frontends.cluster import hostfile_slots, mpi_processes, srun_tasks
from loraflow.frontends.shell import _ENV, _PYTHON, _STARTS, SCRIPT_DIRS, command_from_script

CLI_PROGRAMS = ("trl", "swift", "llamafactory-cli", "lmf", "axolotl", "tune", "litgpt", "vllm", "lm_eval")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")

# Launcher options that take no value; every other option takes one (argparse in deepspeed/launcher/runner.py,
# torch/distributed/run.py, accelerate/commands/launch.py).
_DEEPSPEED_SWITCHES = {"--module", "--no_python", "--no_local_rank", "--no_ssh_check", "--force_multi", "--save_pid",
                       "--enable_each_rank_log", "--elastic_training", "--bind_cores_to_rank", "--ssh", "--no_ssh"}
_TORCHRUN_SWITCHES = {"--standalone", "-m", "--module", "--no_python", "--no-python", "--use_env", "--use-env",
                      "--run_path", "--run-path"}
_ACCELERATE_SWITCHES = {"--multi_gpu", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_xpu", "--cpu",
                        "--tpu", "-m", "--module", "--no_python", "-q", "--quiet", "--debug", "--same_network",
                        "--tpu_use_cluster", "--tpu_use_sudo", "--enable_cpu_affinity", "--mps", "--downcast_bf16"}
_PYTHON_VALUED = {"-X", "-W", "-Q"}


@dataclass
class Arg:
    name: str
    """Without leading dashes; `-` inside the name becomes `_` where the framework's parser accepts both."""
    value: str | list[str] | None
    """None for a bare switch, a list when several values followed the flag."""
    raw: str
    """As written, for messages: `--zero_stage 3`."""

    def one(self) -> str | None:
        return self.value[0] if isinstance(self.value, list) and self.value else (
            None if isinstance(self.value, list) else self.value)


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    launcher: str | None = None
    launcher_args: list[Arg] = field(default_factory=list)
    program: str = ""
    program_kind: str = "script"
    """`module` (python -m X), `script` (a .py path), `cli` (trl, swift, llamafactory-cli, axolotl)."""
    subcommand: str | None = None
    args: list[str] = field(default_factory=list)
    world_size: int | None = None
    world_source: str | None = None
    notes: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    """Servers a launch script starts before this run (`trl vllm-serve ... &`): evidence of how the run samples."""
    hidden_launcher_options: list[str] = field(default_factory=list)
    """Unexpanded variables among the launcher's options (`torchrun $DISTRIBUTED_ARGS train.py`): whatever they hold
    (the process count among it) is not visible."""

    def launcher_value(self, *names: str) -> str | None:
        for arg in self.launcher_args:
            if arg.name in names:
                return arg.one() if arg.value is not None else "true"
        return None

    def describe(self) -> str:
        what = {"module": f"-m {self.program}", "cli": " ".join(filter(None, (self.program, self.subcommand)))}
        return what.get(self.program_kind, self.program)


def is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


def parse_flags(tokens: list[str], switches: frozenset[str] | set[str] = frozenset(), lists: frozenset[str] | set[str]
                = frozenset(), underscore: bool = True) -> tuple[list[Arg], list[str], list[str]]:
    """(flags, positionals, tokens after a bare `--`). A flag takes every following non-flag token when it is in
    `lists`, none when it is in `switches`, otherwise at most one."""
    args: list[Arg] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            return args, positionals, tokens[i + 1:]
        if not is_flag(token):
            positionals.append(token)
            i += 1
            continue
        name, eq, inline = token.lstrip("-").partition("=")
        if underscore:
            name = name.replace("-", "_")
        if eq:
            args.append(Arg(name, inline, token))
            i += 1
            continue
        values: list[str] = []
        j = i + 1
        if name not in switches:
            while j < len(tokens) and not is_flag(tokens[j]) and tokens[j] != "--":
                values.append(tokens[j])
                j += 1
                if name not in lists:
                    break
        value: str | list[str] | None = (values if name in lists else (values[0] if values else None))
        args.append(Arg(name, value, " ".join(tokens[i:j])))
        i = j
    return args, positionals, []


_UNEXPANDED = re.compile(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?$")


def _launcher_options(tokens: list[str], switches: set[str], hidden: list[str] | None = None
                      ) -> tuple[list[Arg], int]:
    """Options of a launcher up to its first positional (the script); returns them and that positional's index.
    An unexpanded variable among them (`$DISTRIBUTED_ARGS`) is skipped and recorded in `hidden`."""
    out: list[Arg] = []
    i = 0
    while i < len(tokens) and (is_flag(tokens[i]) or (_UNEXPANDED.match(tokens[i]) and i + 1 < len(tokens))):
        token = tokens[i]
        if _UNEXPANDED.match(token):
            if hidden is not None:
                hidden.append(token)
            i += 1
            continue
        name, eq, inline = token.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if eq or token in switches or token.split("=")[0] in switches:
            out.append(Arg(name, inline if eq else None, token))
            i += 1
        else:
            out.append(Arg(name, tokens[i + 1] if i + 1 < len(tokens) else None, " ".join(tokens[i:i + 2])))
            i += 2
    return out, i


def _count_devices(spec: str) -> int | None:
    ids = [x for x in spec.replace(" ", "").split(",") if x]
    return len(ids) or None


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).split(":")[-1]) if text is not None else None
    except ValueError:
        return None


def _unseen(count: str | None) -> bool:
    """A process count the command does not show: a variable or `$((...))` the script leaves unset, or torchrun's
    `--nproc_per_node gpu|auto` (one per device of the machine, torch/distributed/run.py determine_local_world_size)."""
    return count is not None and ("$" in count or count in ("gpu", "auto", "cuda", "xpu", "npu"))


def _nodes(cmd: Command, *names: str) -> tuple[int, str]:
    """A launcher's node count and how it reads: `--nnodes 2` (`1:4`, elastic: at least its minimum), or 1 where it
    is unset or not visible (`--nnodes $SLURM_NNODES`: then the world size is a lower bound, and says so)."""
    raw = cmd.launcher_value(*names)
    text = str(raw).split(":")[0] if raw is not None else ""
    if text.isdigit() and int(text) > 0:
        return int(text), f"--{names[0]} {raw}"
    return 1, (f"--{names[0]} {raw} (not visible here: at least 1)" if raw is not None else f"--{names[0]} 1")


def _world_from_launcher(cmd: Command) -> None:
    value = cmd.launcher_value
    for name in ("num_gpus", "num_accelerators", "nproc_per_node", "num_processes"):
        count = value(name)
        if _unseen(count) and f"--{name} {count}" not in cmd.hidden_launcher_options:
            # `--nproc_per_node $GPUS_PER_NODE` where the script computes it (`$(python -c '...device_count()')`):
            # the count is not visible, so both are evaluated, as for a launcher option left in a variable.
            cmd.hidden_launcher_options.append(f"--{name} {count}")
    if cmd.launcher == "deepspeed":
        _deepspeed_world(cmd)
    elif cmd.launcher == "torchrun":
        # torchrun starts --nproc_per_node workers on each of --nnodes nodes (torch/distributed/run.py).
        per_node, (nodes, said) = _int(value("nproc_per_node")), _nodes(cmd, "nnodes")
        if per_node:
            cmd.world_size = per_node * nodes
            cmd.world_source = f"torchrun --nproc_per_node {per_node} {said}"
        elif nodes > 1:
            cmd.world_size, cmd.world_source = nodes, f"torchrun {said}: at least one process on each node"
    elif cmd.launcher == "accelerate":
        # --num_processes is the total over all machines, not per machine (accelerate/commands/launch.py: "The
        # total number of processes to be launched in parallel"); --num_machines alone gives a lower bound.
        procs, (machines, said) = _int(value("num_processes")), _nodes(cmd, "num_machines")
        if procs:
            cmd.world_size, cmd.world_source = procs, f"accelerate launch --num_processes {procs}"
        elif machines > 1:
            cmd.world_size, cmd.world_source = machines, f"accelerate launch {said}: at least one process each"
    elif cmd.launcher == "python" and "WORLD_SIZE" not in cmd.env and cmd.world_size is None and not any(
            h.startswith(("srun", "mpirun")) for h in cmd.hidden_launcher_options):
        cmd.world_size, cmd.world_source = 1, "python (one process)"
    if cmd.world_size is None and "WORLD_SIZE" in cmd.env and _int(cmd.env["WORLD_SIZE"]):
        cmd.world_size, cmd.world_source = _int(cmd.env["WORLD_SIZE"]), f"WORLD_SIZE={cmd.env['WORLD_SIZE']}"


def _deepspeed_world(cmd: Command) -> None:
    """deepspeed/launcher/runner.py: --num_gpus per node on --num_nodes nodes, else the devices --include names,
    else the slots of the --hostfile's hosts, else every visible device of the one machine."""
    value = cmd.launcher_value
    gpus, (nodes, said) = _int(value("num_gpus", "num_accelerators")), _nodes(cmd, "num_nodes")
    include, hostfile = value("include", "i"), value("hostfile", "H")
    found = resolve_path(hostfile) if hostfile and not _unseen(hostfile) else None
    slots = hostfile_slots(str(found)) if found else None
    if gpus:
        cmd.world_size, cmd.world_source = gpus * nodes, f"deepspeed --num_gpus {gpus} {said}"
    elif include:
        hosts = [h.partition(":")[2] for h in include.split("@")]
        count = sum(_count_devices(h) or 0 for h in hosts)
        cmd.world_size, cmd.world_source = (count or None), f"deepspeed --include {include}"
    elif slots:
        cmd.world_size, cmd.world_source = slots, f"deepspeed --hostfile {hostfile}: {slots} slots"
    elif nodes > 1:
        cmd.world_size, cmd.world_source = nodes, f"deepspeed {said}: at least one process on each node"
    elif visible_devices(cmd)[0] and not hostfile:
        # Without --num_gpus/--include the launcher uses every visible device (deepspeed/launcher/runner.py).
        cmd.world_size, cmd.world_source = visible_devices(cmd)


# `accelerate launch` options; the trl CLI forwards these from its own command line to accelerate
# (trl/cli/commands/training.py, trl/cli/accelerate_config.py maps --accelerate_config NAME to --config_file).
ACCELERATE_OPTIONS = {
    "config_file", "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
    "mixed_precision", "multi_gpu", "use_deepspeed", "use_fsdp", "zero_stage", "offload_optimizer_device",
    "offload_param_device", "deepspeed_config_file", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile",
    "deepspeed_multinode_launcher", "fsdp_version", "fsdp_offload_params", "fsdp_use_orig_params",
    "fsdp_activation_checkpointing", "fsdp_sharding_strategy", "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap", "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states", "fsdp_reshard_after_forward", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
    "gpu_ids", "dynamo_backend", "num_cpu_threads_per_process", "same_network", "rdzv_backend", "accelerate_config"}


def pull_accelerate_options(cmd: Command) -> None:
    """Move accelerate launch options out of a CLI's own arguments into `cmd.launcher_args` (the trl CLI)."""
    kept: list[str] = []
    launch: list[str] = []
    i = 0
    while i < len(cmd.args):
        token = cmd.args[i]
        name = token.lstrip("-").partition("=")[0].replace("-", "_")
        if is_flag(token) and name in ACCELERATE_OPTIONS:
            flag = "--config_file" if name == "accelerate_config" else f"--{name}"
            if "=" in token:
                launch.append(f"{flag}={token.partition('=')[2]}")
                i += 1
            elif flag in _ACCELERATE_SWITCHES:
                launch.append(flag)
                i += 1
            else:
                launch += [flag] + cmd.args[i + 1:i + 2]
                i += 2
        else:
            kept.append(token)
            i += 1
    if launch:
        options, _ = _launcher_options(launch, _ACCELERATE_SWITCHES)
        cmd.launcher, cmd.launcher_args, cmd.args = "accelerate", cmd.launcher_args + options, kept
        _world_from_launcher(cmd)


def visible_devices(cmd: Command) -> tuple[int | None, str | None]:
    for var in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if var in cmd.env and _count_devices(cmd.env[var]):
            return _count_devices(cmd.env[var]), f"{var}={cmd.env[var]}"
    return None, None


def _env_word(cmd: Command, rest: list[str]) -> list[str]:
    """`env`, `nohup`... or a `VAR=value` in front of the launch: the words after it."""
    head = rest[0]
    if _ENV.match(head):
        key, _, val = head.partition("=")
        if val.startswith("$(") and val.count("(") > val.count(")"):
            # `N=$(nvidia-smi --list-gpus | wc -l) swift sft ...` split by a shell that did not run it: the
            # substitution's words go with it, and its value is unknown.
            end = next((i for i, t in enumerate(rest[1:], 1) if t.endswith(")")), 0)
            rest = rest[end:]
            val = ""
        cmd.env[key] = val
    return rest[1:]


def _cluster_launcher(cmd: Command, rest: list[str], argv: list[str]) -> list[str]:
    """srun / mpirun / mpiexec in front of the launch: the words from the program it starts."""
    head = rest[0]
    # srun/mpirun options are many and differ per site (`-N 2`, `--gres=gpu:8`, `-x NCCL_DEBUG`): rather than
    # know them all, skip to the first word that starts something we read.
    start = next((i for i, t in enumerate(rest[1:], 1) if _starts_program(t)), None)
    if start is None:
        raise LoraflowError(f"`{head}` launches nothing loraflow reads in `{shlex.join(argv)}`: expected "
                            "torchrun, deepspeed, accelerate, python or a training CLI after its options.")
    if head in ("timeout", "nsys"):
        return rest[start:]
    cmd.notes.append(f"launched through `{head}`; its options other than the process count were not read")
    program = Path(rest[start]).name
    plain = bool(_PYTHON.match(program)) or program.endswith(".py")
    # srun and mpirun start one copy of their program per task (`srun python train.py` under `#SBATCH
    # --ntasks-per-node=4`). srun's tasks before a torchrun, deepspeed or accelerate are one launcher per node,
    # which counts its own processes, so there the count is left to that launcher.
    count, said = srun_tasks(rest[1:start], cmd.env) if head == "srun" else mpi_processes(rest[1:start])
    if count and (plain or head != "srun"):
        cmd.world_size, cmd.world_source = count, said
    elif plain:
        cmd.hidden_launcher_options.append(said)
    return rest[start:]


# `uv run [OPTIONS] COMMAND...` (NeMo-RL's launches): the options that take a value; the others are switches.
_UV_VALUED = {"--extra", "--with", "--with-editable", "--with-requirements", "--group", "--only-group", "--package",
              "--python", "-p", "--directory", "--project", "--env-file", "--index", "--index-url", "--no-extra"}


def _uv_run(tokens: list[str]) -> list[str]:
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        i += 1 if "=" in tokens[i] or tokens[i] not in _UV_VALUED else 2
    return tokens[i:]


def _script_line(cmd: Command, path: str, depth: int) -> Command:
    """`bash run.sh`: the launch line inside the script, with the outer line's environment."""
    tokens = command_from_script(path)
    inner = split_command(tokens, depth + 1)
    inner.env = {**cmd.env, **inner.env}
    inner.notes[:0] = [f"launch line read from {path}", *getattr(tokens, "notes", [])]
    inner.started = list(getattr(tokens, "started", []))
    return inner


def _shell_string(cmd: Command, line: str, depth: int) -> Command:
    """`srun bash -c "$LAUNCHER $TRAIN_CMD"` (SLURM jobs that let each node expand $SLURM_PROCID): the quoted string
    is the command line, split as the inner shell splits it, with the outer line's environment and process count."""
    inner = split_command(shlex.split(line), depth + 1)
    inner.env = {**cmd.env, **inner.env}
    inner.notes = cmd.notes + ["launch line read from the string after `bash -c`"] + inner.notes
    if inner.world_size is None and cmd.world_size is not None:
        inner.world_size, inner.world_source = cmd.world_size, cmd.world_source
    return inner


_PROMPT_WORD = re.compile(r"\$|>|\([\w.-]+\)|[\w.@:~/-]*\$|[\w.-]+@[\w.-]+:\S*#")
"""A shell prompt's words before a pasted command: `$`, `(venv)`, `user@host:~/x$`, `root@a1b2:/w#`."""


def split_command(argv: list[str], depth: int = 0) -> Command:
    """Peel env assignments and launchers off `argv` (already split by the shell)."""
    if not argv:
        raise LoraflowError("no command line given: put the launch command after `--`, e.g. "
                            "`loraflow check -- deepspeed --module openrlhf.cli.train_sft --zero_stage 3 ...`.")
    cmd = Command(argv=list(argv))
    rest = list(argv)
    while len(rest) > 1 and _PROMPT_WORD.fullmatch(rest[0]):  # `$ torchrun ...` copied with its shell prompt
        rest = rest[1:]
    if rest[0].startswith("!") and len(rest[0]) > 1:
        # A notebook cell's `!swift sft ...` (IPython runs the rest of the line in a shell; Colab, Kaggle).
        rest[0] = rest[0][1:]
        cmd.notes.append("a notebook shell escape (`!`): the rest of the line is the launch command")
    if "&&" in rest:  # `CUDA_VISIBLE_DEVICES=0,1 && torchrun ...`: assignments chained before the command
        cut = len(rest) - rest[::-1].index("&&")
        if all(_ENV.match(t) for t in rest[:cut - 1] if t != "&&"):
            rest = [t for t in rest[:cut - 1] if t != "&&"] + rest[cut:]
            cmd.notes.append("assignments chained with `&&` before the command: read as its environment")
    while rest:
        head = rest[0] = Path(rest[0]).name if Path(rest[0]).name in _STARTS else rest[0]  # `/env/x/bin/torchrun`
        if head in ("env", "nohup", "time", "exec", "command") or _ENV.match(head):
            rest = _env_word(cmd, rest)
        elif head in ("bash", "sh") and len(rest) > 1 and depth < 3 and (rest[1] == "-c" or rest[1][:1] != "-"):
            return _shell_string(cmd, " ".join(rest[2:3]), depth) if rest[1] == "-c" else _script_line(
                cmd, rest[1], depth)
        elif head in _CLUSTER_LAUNCHERS:
            rest = _cluster_launcher(cmd, rest, argv)
        elif head == "uv" and rest[1:2] == ["run"]:
            rest = _uv_run(rest[2:])
        elif head == "ray":
            if "--" not in rest:
                raise LoraflowError("`ray job submit` without `--`: cannot find the training command after it.")
            cmd.notes.append("launched through `ray job submit`; the processes are placed by Ray")
            rest = rest[rest.index("--") + 1:]
        elif head in ("deepspeed", "torchrun") or (head == "accelerate" and rest[1:2] == ["launch"]):
            name = head
            tokens = rest[2:] if head == "accelerate" else rest[1:]
            switches = {"deepspeed": _DEEPSPEED_SWITCHES, "torchrun": _TORCHRUN_SWITCHES}.get(name,
                                                                                            _ACCELERATE_SWITCHES)
            options, index = _launcher_options(tokens, switches, cmd.hidden_launcher_options)
            cmd.launcher, cmd.launcher_args = name, options
            if cmd.hidden_launcher_options:
                cmd.notes.append(f"{name} options in {' '.join(cmd.hidden_launcher_options)} are not visible here "
                                 "(an unset variable): the number of processes is evaluated both ways")
            rest = tokens[index:]
            if any(a.name in ("module", "m") for a in options):
                cmd.program_kind = "module"
            if any(a.name in ("no_python",) for a in options):
                cmd.program_kind = "cli"
            break
        elif _PYTHON.match(head):
            i = 1
            while i < len(rest) and is_flag(rest[i]) and rest[i] != "-m":
                i += 2 if rest[i] in _PYTHON_VALUED else 1
            if i < len(rest) and rest[i] == "-m" and i + 1 < len(rest) and rest[i + 1] in (
                    "torch.distributed.run", "torch.distributed.launch"):
                rest = ["torchrun"] + rest[i + 2:]
                continue
            cmd.launcher = cmd.launcher or "python"
            if i < len(rest) and rest[i] == "-m":
                cmd.program_kind = "module"
                i += 1
            rest = rest[i:]
            break
        else:
            cmd.program_kind = "cli" if Path(head).name in CLI_PROGRAMS else cmd.program_kind
            break
    if not rest:
        raise LoraflowError(f"found no training program in `{shlex.join(argv)}`: after the launcher there must be a "
                            "script, `-m module` or a CLI such as trl, swift, llamafactory-cli or axolotl.")
    cmd.program, rest = rest[0], rest[1:]
    if cmd.program_kind == "script" and Path(cmd.program).name in CLI_PROGRAMS:
        cmd.program_kind = "cli"
    if cmd.program_kind == "cli":
        cmd.program = Path(cmd.program).name
        if rest and not is_flag(rest[0]):
            cmd.subcommand, rest = rest[0], rest[1:]
    cmd.args = rest
    _world_from_launcher(cmd)
    return cmd


def parse_bool(value: str | list[str] | None, where: str) -> bool:
    """A switch (None) is True; otherwise the usual spellings HfArgumentParser and OmegaConf accept."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None or value is True:
        return True
    if value is False:
        return False
    text = str(value).strip().lower()
    if text in ("1", "true", "t", "yes", "y", "on"):
        return True
    if text in ("0", "false", "f", "no", "n", "off", "none", "null"):
        return False
    raise LoraflowError(f"{where}: `{value}` is not a boolean; write true or false.")




_CLUSTER_LAUNCHERS = ("srun", "mpirun", "mpiexec", "timeout", "nsys")
"""Commands whose options come before the program they start; `timeout 2400 torchrun ...` (SLURM jobs) and `nsys
profile -o p python ...` run one command and place no processes of their own."""


def _starts_program(token: str) -> bool:
    return (token in _STARTS[:-3] or token in CLI_PROGRAMS or bool(_PYTHON.match(token)) or token.endswith(".py")
            or token in ("bash", "sh"))


def script_command(paths: list[str], framework: str, example: str) -> Command:
    """The launch line of the one training script a flags-only framework is given as files (`check --framework NAME
    run.sh`); `example` shows the line it holds."""
    if len(paths) != 1:
        raise LoraflowError(f"--framework {framework} takes one launch script holding `{example}`, or give the "
                            "command after `--`.")
    return split_command(command_from_script(paths[0]))


def resolve_path(name: str, *bases: str | os.PathLike | None) -> Path | None:
    """An existing file: `name` as given (relative to the working directory), then relative to each base."""
    try:
        candidate = Path(name).expanduser()
    except RuntimeError:  # `~key` (a Hydra/OmegaConf deletion) names no user's home
        candidate = Path(name)
    if candidate.is_file():
        return candidate
    for base in (*bases, *SCRIPT_DIRS.get()):
        if base is not None and (Path(base) / name).is_file():
            return Path(base) / name
    return None
