"""A batch script's scheduler directives read for what they put in the job's environment.

`#SBATCH --nodes=4`, `--ntasks-per-node=8`, `--gres=gpu:8`, `--gpus-per-node=8` make SLURM set SLURM_NNODES,
SLURM_JOB_NUM_NODES, SLURM_NTASKS_PER_NODE, SLURM_NTASKS and SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE in the job's
environment (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES"), which launch lines then use: `torchrun --nnodes
$SLURM_NNODES --nproc_per_node $SLURM_GPUS_ON_NODE`, `accelerate launch --num_processes $((SLURM_NNODES * 8))`,
`srun python train.py` (one process per task). Only what a directive states is set; a count left to the command line
that submits the job (`sbatch --nodes=2 job.sh`) stays unknown. Imports nothing of loraflow's (shell.py uses it)."""

from __future__ import annotations

import re

_DIRECTIVE = re.compile(r"^\s*#SBATCH\s+(.*)$")
# sbatch's short options that take a value (-N nodes, -n tasks, -G gpus); the rest are read by their long names.
_SHORT = {"-N": "nodes", "-n": "ntasks", "-G": "gpus"}
_COUNT = re.compile(r"(\d+)")


def _options(text: str) -> dict[str, str]:
    """`--name=value`, `--name value`, `-N2`, `-N 2` from every `#SBATCH` line (a trailing `# comment` left out)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        words = m.group(1).split("#")[0].split()
        i = 0
        while i < len(words):
            word = words[i]
            name, eq, value = word.lstrip("-").partition("=")
            if word[:2] in _SHORT:
                name, value = _SHORT[word[:2]], word[2:]
                eq = "=" if value else ""
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            out[name] = value
            i += 1
    return out


def _number(value: str | None, last: bool = False) -> int | None:
    """The count in `4`, `2-4` (a node range: at least its minimum), `gpu:a100:8` (the last number)."""
    found = _COUNT.findall(value or "")
    return int(found[-1] if last else found[0]) if found else None


def slurm_environment(text: str) -> dict[str, str]:
    """The SLURM variables a batch script's `#SBATCH` directives set in the job's environment."""
    opts = _options(text)
    env: dict[str, str] = {}
    nodes = _number(opts.get("nodes"))
    per_node = _number(opts.get("ntasks-per-node"))
    tasks = _number(opts.get("ntasks"))
    gpus = _number(opts.get("gpus-per-node"), last=True)
    gres = next((g for g in (opts.get("gres") or "").split(",") if g.startswith("gpu")), None)
    on_node = gpus or (_number(gres, last=True) if gres and gres != "gpu" else (1 if gres else None))
    if nodes:
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = str(nodes)
    if per_node:
        env["SLURM_NTASKS_PER_NODE"] = str(per_node)
    if tasks or (nodes and per_node):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(tasks or nodes * per_node)
    if gpus:
        env["SLURM_GPUS_PER_NODE"] = str(gpus)
    if on_node:
        env["SLURM_GPUS_ON_NODE"] = str(on_node)
    return env


def _option(words: list[str], *names: str) -> str | None:
    """The value of `-n 8`, `-n8`, `--ntasks=8`, `--ntasks 8` among a cluster launcher's options."""
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(name + "=") or (len(name) == 2 and word.startswith(name) and word[2:].isdigit()):
                return word[len(name):].lstrip("=")
    return None


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def srun_tasks(words: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    """How many copies of its program `srun [options]` starts: `-n/--ntasks`, else `-N/--nodes` x
    `--ntasks-per-node`, else the job's SLURM_NTASKS (srun(1): a step takes the job's task count unless told)."""
    tasks = _whole(_option(words, "-n", "--ntasks"))
    if tasks:
        return tasks, f"srun --ntasks {tasks}"
    nodes = _whole(_option(words, "-N", "--nodes")) or _whole(env.get("SLURM_NNODES"))
    per_node = _whole(_option(words, "--ntasks-per-node")) or _whole(env.get("SLURM_NTASKS_PER_NODE"))
    if nodes and per_node:
        return nodes * per_node, f"srun: {nodes} node(s) x --ntasks-per-node {per_node}"
    if _whole(env.get("SLURM_NTASKS")):
        return int(env["SLURM_NTASKS"]), f"srun: the job's SLURM_NTASKS={env['SLURM_NTASKS']} (#SBATCH)"
    if per_node:  # the node count is left to submission (`--nodelist`, `sbatch -N`): at least one node's tasks
        return per_node, f"srun: --ntasks-per-node {per_node} (at least; the node count is not in the script)"
    return None, "srun's task count (set when the job is submitted)"


def mpi_processes(words: list[str]) -> tuple[int | None, str]:
    """`mpirun -np 8`, `-n 8`, `--np 8`; a per-node count alone (`-N 4`, `--npernode 4`, `-ppn 4`) gives at least
    that many. None when the count comes from the host list or scheduler."""
    count = _whole(_option(words, "-np", "--np", "-n", "-c"))
    if count:
        return count, f"mpirun -np {count}"
    per_node = _whole(_option(words, "-N", "--npernode", "-npernode", "-ppn"))
    if per_node:
        return per_node, f"mpirun: {per_node} process(es) per node (at least)"
    return None, "mpirun's process count (from its host list or the scheduler)"


def hostfile_slots(path: str) -> int | None:
    """The processes a DeepSpeed hostfile places: the sum of its `host slots=N` lines (deepspeed/launcher/runner.py
    fetch_hostfile), None when the file cannot be read or gives no slots."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    slots = [re.search(r"slots\s*=\s*(\d+)", line.split("#")[0]) for line in lines]
    total = sum(int(m.group(1)) for m in slots if m)
    return total or None
