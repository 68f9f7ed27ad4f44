"""Rollouts on a vLLM engine, with the trainer's policy synced to it and checked at every sync.

A run with rl.rollout.engine=vllm samples on one or more vLLM servers: local (one `vllm serve` that rank 0 starts
for the run and stops at its end) or remote (rl.rollout.urls). After each update (rl.rollout.sync_every) the
trainer hands the engine the new policy in one of two ways (the plan chose, rules vllm-adapter-unservable and
vllm-max-lora-rank):
- adapter: the engine's trainable_state() gathers only the trainable tensors (ZeRO-3 and FSDP2 never gather the
  frozen base), rank 0 writes the LoRA tensors as a PEFT adapter directory, atomically, as version N, and every
  server loads it under a name of its own, `loraflow-RUN-vN` (RUN: random per run, so runs sharing a server never
  collide); the version before is unloaded, and the last one when the run ends. Rollouts name the version they
  used.
- merged: with the weights gathered once (as generation gathers them), rank 0 writes each changed weight with the
  adapter merged in (W + s*B@A; DoRA's magnitude applied; fully trained modules as they are) and every server
  reloads those tensors in place. The trainer's own weights are never merged into.
Each prompt is one request with `n` = group size and a seed derived from (seed, step, prompt index): vLLM seeds
completion k with seed + k, so the samples do not depend on how prompts are split over ranks or servers.

The check (rule vllm-stale-policy): on the rollout right after a sync, the engine's log-probability of every sampled
token is compared with the trainer's (the policy the update starts from); beyond the precision's bound the run stops
before the update with the evidence.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from loraflow.errors import GuardError
from loraflow.rl.rollout import _seed
from loraflow.rl.vllm_server import Client, EngineError, LocalServer, Request, ServerSettings, complete_all, \
    copy_tokenizer

log = logging.getLogger("loraflow")

ENGINE_DTYPES = {"fp32": "float32", "bf16-mixed": "bfloat16", "bf16": "bfloat16"}
TOKENIZER_PROBE = "The engine's tokenizer: 12 + 3 = 15, naïve café, <tool_call>\n\tdone."
"""Words, digits, spaces, accents, a tag and control characters: tokenizers that differ split some of it apart."""


def hf_name(peft_name: str) -> str | None:
    """The model's own name of a PEFT-wrapped base weight (None for adapter tensors and loraflow's value head)."""
    if "lora_" in peft_name or ".v_head." in peft_name or ".original_module." in peft_name:
        return None
    name = peft_name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
    return name[len("base_model.model."):] if name.startswith("base_model.model.") else name


@dataclass
class SyncRecord:
    version: int
    kind: str
    bytes: int
    seconds: float


class EngineRollouts:
    """The vLLM side of a run: its servers, the policy version they hold, sampling and syncing."""

    def __init__(self, plan, run_dir: Path):
        self.plan = plan
        self.cfg = plan.config.rl.rollout
        self.rollout = plan.rollout
        self.dir = run_dir / "rollout"
        self.server: LocalServer | None = None
        self.clients: list[Client] = []
        self.version = 0
        self.base_name = "base"
        """The name the servers serve the base under (Client.base_model; `base` for loraflow's own)."""
        self.served = self.base_name
        """The model name requests use: the base's, or the loaded adapter version (name())."""
        self.fresh = False
        """Whether the engine got the policy at the last sync (the next rollout is checked)."""
        self.last_sync: SyncRecord | None = None
        self.tag = ""
        self.rank = 0

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, engine) -> None:
        """Rank 0 starts the local server (or checks the remote ones) and every rank learns the URLs
        (collective)."""
        import uuid

        urls = list(self.cfg.urls)
        error, tag, base_name = None, f"loraflow-{uuid.uuid4().hex[:8]}", "base"
        if not urls and self.rollout.base is None:  # the engine starts from the trainer's base: write it once
            with engine.gathered_for_generation() as model:
                if engine.rank == 0:
                    self._write_base(model)
        if engine.rank == 0:
            try:
                if not urls:
                    urls = [self._start_local()]
                for url in urls:
                    if not Client(url).healthy():
                        raise EngineError(f"rl.rollout.urls: no vLLM server answers at {url}/health; start it with "
                                          "`vllm serve MODEL --enable-lora --logprobs-mode processed_logprobs` (and "
                                          "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True for adapter sync).")
                names = [Client(u).base_model() for u in urls]
                if len(set(names)) > 1:
                    raise EngineError(f"rl.rollout.urls: the servers serve different models ({', '.join(names)}); "
                                      "start every one on the run's base under one --served-model-name.")
                base_name = names[0]
                error = self._tokenizer_mismatch(urls, base_name)
            except EngineError as exc:
                error = str(exc)
        urls, error, self.tag, base_name = engine.gather_objects((urls, error, tag, base_name))[0]
        self.base_name = self.served = base_name
        self.rank = engine.rank
        if error:
            self.close()
            raise EngineError(error)
        self.clients = [Client(u) for u in urls]

    def _tokenizer_mismatch(self, urls: list[str], base_name: str) -> str | None:
        """Rule vllm-tokenizer-mismatch: prompts go to the engine as the trainer's token ids and samples come back
        as ids, so nothing is tokenized twice; but an engine whose tokenizer differs serves another vocabulary (a
        server started on another model), and its ids would mean other text. Each server's tokenization of a probe
        text must equal the trainer's."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.rollout.tokenizer_dir)
        want = tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False)
        for url in urls:
            got = Client(url).tokenize(base_name, TOKENIZER_PROBE)
            if got != want:
                return (f"[vllm-tokenizer-mismatch] the vLLM server at {url} tokenizes {TOKENIZER_PROBE!r} as "
                        f"{got[:12]}, the trainer's tokenizer ({self.rollout.tokenizer_dir}) as {want[:12]}: the "
                        "server serves another model or tokenizer, so the token ids it samples would mean other "
                        "text. Start it on the run's base and tokenizer (`vllm serve BASE --tokenizer "
                        "TOKENIZER`), or set model.tokenizer to the one it serves.")
        return None

    def _start_local(self) -> str:
        base = self.rollout.base or self.dir / "base"
        self.server = LocalServer(ServerSettings(
            model=str(base), max_lora_rank=self.rollout.max_lora_rank, max_model_len=self.rollout.max_model_len,
            dtype=ENGINE_DTYPES[self.plan.config.precision.mode], seed=self.plan.config.train.seed,
            lora=self.rollout.sync == "adapter", on_cpu=self.plan.device == "cpu",
            gpu_memory=self.cfg.engine_memory), self.dir / "vllm.log")
        log.info("rollout engine: starting a local vLLM server (%s; log %s)", self.server.python, self.server.log)
        started = time.monotonic()
        client = self.server.start()
        log.info("rollout engine: vLLM answered at %s after %.0f s", client.url, time.monotonic() - started)
        return client.url

    def _write_base(self, model) -> None:
        """The trainer's base (merged adapters of model.merge_adapters included, the trained adapters left out)
        under the run directory, for a local engine to start from (rank 0, weights whole)."""
        from safetensors.torch import save_file

        target = self.dir / "base"
        weights = {}
        for name, p in model.named_parameters():
            hf = hf_name(name)
            if hf is not None:
                weights[hf] = p.detach().cpu().contiguous()
        weights.update(dequantized_weights(model))  # 4-bit codes replaced by the weights they stand for
        with written(target) as tmp:
            save_file(weights, str(tmp / "model.safetensors"))
            inner = model.get_base_model() if hasattr(model, "get_base_model") else model
            config = inner.config.to_dict()
            config.pop("quantization_config", None)  # the written weights are plain floats
            (tmp / "config.json").write_text(json.dumps(config, indent=1, default=str))
            copy_tokenizer(Path(self.rollout.tokenizer_dir), tmp)

    def name(self, version: int) -> str:
        return f"{self.tag}-v{version}"

    def close(self) -> None:
        if self.served != self.base_name and self.server is None and self.rank == 0:  # remote: as it was found
            for client in self.clients:
                try:
                    client.unload_adapter(self.served)
                except EngineError:
                    pass
            self.served = self.base_name
        if self.server is not None:
            self.server.stop()
            self.server = None

    # -- syncing --------------------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return step % self.cfg.sync_every == 0

    def sync(self, engine, step: int) -> SyncRecord | None:
        """Hand the engine the policy the next update starts from, when due (collective)."""
        if not self.due(step):
            self.fresh = False
            return None
        started = time.monotonic()
        version = self.version + 1
        if self.rollout.sync == "adapter":
            state = engine.trainable_state()  # only the trainable tensors are gathered, never the frozen base
            moved = self._write_adapter(engine, state, version) if engine.rank == 0 else 0
        else:
            with engine.gathered_for_generation() as model:
                moved = self._write_merged(model, version) if engine.rank == 0 else 0
        error = None
        if engine.rank == 0:
            try:
                self._load(version)
            except EngineError as exc:
                error = str(exc)
        (moved, error) = engine.gather_objects((moved, error))[0]
        if error:
            raise EngineError(error)
        self.version, self.fresh = version, True
        self.served = self.name(version) if self.rollout.sync == "adapter" else self.base_name
        self.last_sync = SyncRecord(version, self.rollout.sync, int(moved), time.monotonic() - started)
        return self.last_sync

    def _version_dir(self, version: int) -> Path:
        return self.dir / f"policy-v{version}"

    def _write_adapter(self, engine, state: dict[str, torch.Tensor], version: int) -> int:
        """The LoRA tensors of `state` as a PEFT adapter directory vLLM loads: adapter_config.json without
        modules_to_save, adapter_model.safetensors with only lora_A/lora_B (written atomically)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        model = engine.module
        tensors = {k: v.contiguous() for k, v in get_peft_model_state_dict(model, state_dict=state).items()
                   if ".lora_A." in k or ".lora_B." in k}
        config = model.peft_config["default"].to_dict()
        config["modules_to_save"] = None
        config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
        with written(self._version_dir(version)) as tmp:
            save_file(tensors, str(tmp / "adapter_model.safetensors"))
            (tmp / "adapter_config.json").write_text(json.dumps(config, indent=1, default=str))
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _write_merged(self, model, version: int) -> int:
        """The changed weights with the adapter merged in, under the model's own names (written atomically)."""
        from safetensors.torch import save_file

        tensors = merged_weights(model, self.plan.config.adapter.method == "full")
        with written(self._version_dir(version)) as tmp:
            save_file(tensors, str(tmp / "model.safetensors"))
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _load(self, version: int) -> None:
        path = self._version_dir(version)
        for client in self.clients:
            if self.rollout.sync == "adapter":
                client.load_adapter(self.name(version), path)
                if version > 1:
                    client.unload_adapter(self.name(version - 1))
            else:
                client.reload_weights(path)
        old = self._version_dir(version - 1)
        if version > 1 and old.exists():
            shutil.rmtree(old, ignore_errors=True)

    # -- sampling -------------------------------------------------------------------------------------------
    def sample(self, prompts: list[list[int]], index: list[int], step: int, group: int, stop: list[int],
               pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`group` completions of each prompt ([len(prompts) * group, max_new_tokens], padded after the stop
        token) and the engine's log-probability of each sampled token (0 after the stop)."""
        r = self.plan.config.rl
        seed = self.plan.config.train.seed
        requests = [Request(p, group, _seed((seed, step, i))) for p, i in zip(prompts, index)]
        answers = complete_all(self.clients, self.served, requests, r.max_new_tokens, r.temperature, stop)
        n = len(prompts) * group
        tokens = torch.full((n, r.max_new_tokens), pad, dtype=torch.long)
        logps = torch.zeros((n, r.max_new_tokens), dtype=torch.float32)
        row = 0
        for completions in answers:
            for ids, lps in completions:
                ids, lps = ids[:r.max_new_tokens], lps[:r.max_new_tokens]
                tokens[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                logps[row, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
                row += 1
        return tokens, logps

    # -- the check ------------------------------------------------------------------------------------------
    def bound(self) -> float:
        return self.rollout.bound

    def check(self, engine, diffs: list[torch.Tensor], step: int, weights: list[torch.Tensor] = ()
              ) -> dict[str, float]:
        """The largest and mean |engine - trainer| log-prob over this step's sampled tokens on every rank
        (collective), and the mean importance weight and the fraction of tokens the cap changed when `weights` are
        given; stops the run before the update when the largest difference is beyond the bound."""
        local = torch.cat([d.flatten() for d in diffs]) if diffs else torch.zeros(0)
        w = torch.cat([x.flatten() for x in weights]) if weights else torch.zeros(0)
        cap = self.rollout.importance_cap
        mine = (float(local.max()) if local.numel() else 0.0, float(local.sum()), float(local.numel()),
                float(w.sum()), float(((w >= cap) | (w == 0)).sum()))
        gathered = engine.gather_objects(mine)
        worst = max(g[0] for g in gathered)
        total, count, w_sum, capped = (sum(g[k] for g in gathered) for k in range(1, 5))
        stats = {"rollout/logprob_diff_max": worst, "rollout/logprob_diff_mean": total / max(count, 1.0),
                 "rollout/policy_version": float(self.version)}
        if weights:
            stats["rollout/importance_mean"] = w_sum / max(count, 1.0)
            stats["rollout/importance_capped"] = capped / max(count, 1.0)
        if self.last_sync is not None and self.fresh:
            stats["rollout/sync_bytes"] = float(self.last_sync.bytes)
            stats["rollout/sync_seconds"] = self.last_sync.seconds
        if self.fresh and worst > self.bound():
            raise GuardError(
                f"[vllm-stale-policy] step {step}: the rollout engine's log-probabilities of the sampled tokens differ "
                f"from the trainer's by up to {worst:.3g} (mean {total / max(count, 1.0):.3g} over {int(count)} "
                f"tokens) right after policy version {self.version} was synced ({self.rollout.sync} sync); the bound "
                f"for precision.mode={self.plan.config.precision.mode} is {self.bound():g}. The engine is sampling "
                "from another policy than the one being trained (a stale or wrong sync, a server started without "
                "--logprobs-mode processed_logprobs, or another base model), so the update was not applied. Check "
                "that rl.rollout.urls serve the run's base model, or raise rl.rollout.max_logprob_diff if the "
                "numerics of this setup differ by more.")
        return stats


@contextlib.contextmanager
def written(target: Path) -> Iterator[Path]:
    """A directory to write into that appears as `target` only when complete (checkpoints.store.publish_dir): an
    engine never loads a half-written policy."""
    from loraflow.checkpoints.store import publish_dir

    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    publish_dir(tmp, target)


def merged_weights(model, full: bool) -> dict[str, torch.Tensor]:
    """Every weight the training changed, with adapters merged in, by the model's own names (rank 0, weights
    whole). LoRA: W + s * B @ A; DoRA: m * (W + s * B @ A) / ||W + s * B @ A|| per output row; modules trained in
    full and full fine-tuning: the weights as they are."""
    from peft.tuners.lora import LoraLayer

    from loraflow.setup.quantize import dequantized_weight, is_quantized_linear

    out = dequantized_weights(model)  # a 4-bit base the engine cannot hold as it is: every quantized weight, always
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and "default" in module.lora_A and hasattr(module.base_layer, "weight"):
                quantized = is_quantized_linear(module.base_layer)
                base = dequantized_weight(module.base_layer) if quantized else module.base_layer.weight
                delta = module.get_delta_weight("default").float()
                weight = base.float() + delta
                if module.use_dora.get("default"):
                    norm = weight.norm(p=2, dim=1, keepdim=True)
                    magnitude = module.lora_magnitude_vector["default"].weight.float().view(-1, 1)
                    weight = weight * (magnitude / norm)
                hf = hf_name(f"{name}.weight")
                out[hf] = weight.to(base.dtype).cpu().contiguous()
        for name, p in model.named_parameters():
            if (full or ".modules_to_save.default." in name) and p.requires_grad:
                hf = hf_name(name)
                if hf is not None:
                    out[hf] = p.detach().cpu().contiguous()
    return out


def dequantized_weights(model) -> dict[str, torch.Tensor]:
    """Every 4-bit (or 8-bit) base weight as the float weight it computes with, by the model's own names: what an
    engine must hold for the trainer's policy (empty for an unquantized model)."""
    from loraflow.setup.quantize import dequantized_weight, quantized_linears

    with torch.no_grad():
        return {hf_name(f"{name}.weight"): dequantized_weight(module).cpu().contiguous()
                for name, module in quantized_linears(model).items()}
