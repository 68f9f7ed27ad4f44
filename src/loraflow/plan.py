"""resolve(config, environment) -> Plan: every concrete choice of a run, each with its reason.

This is the one decision function. It maps the config onto the normalized Setup, lets the rule registry apply its
fixes and report its errors and warnings, and turns the result into typed choices that `train` executes and
`check` prints. Nothing downstream re-decides: setup code reads `plan.<choice>` and never the raw config for
anything the plan covers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from loraflow.config.schema import Config
from loraflow.data.sources import has_eval_set
from loraflow.environment import Environment
from loraflow.errors import ConfigError, PlanError
from loraflow.rules import Finding, Setup, evaluate
from loraflow.setup.model import ModelInfo

TRAIN_MODULE_GROUPS = ("embeddings", "lm_head", "norms")


@dataclass
class Decision:
    key: str
    value: Any
    reason: str
    rule: str | None = None


@dataclass
class Plan:
    config: Config
    env: Environment
    model: ModelInfo
    setup: Setup
    findings: list[Finding]
    decisions: list[Decision] = field(default_factory=list)
    # The typed choices that setup code executes.
    device: str = "cpu"
    load_dtype: torch.dtype = torch.float32
    trainable_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    modules_to_save: list[str] = field(default_factory=list)
    ensure_weight_tying: bool = False
    checkpoint_layers: list[int] = field(default_factory=list)
    reentrant: bool | None = None
    input_grad_hook: bool = False
    use_cache: bool = False
    checkpoint_in_engine: bool = False
    """FSDP2 with checkpointing inside the sharded unit: the engine wraps the layers, not transformers."""
    head: str = "lm"
    """`lm` (a causal LM), `score` (a scalar score head: the reward model) or `value` (a causal LM with PPO's value
    head)."""
    reference: str | None = None
    """How the stage gets reference log-probs: adapters-disabled, copy, precomputed, or None (no reference)."""
    phases: list = field(default_factory=list)
    """The phases of one step with each model's mode (phases.Phase)."""
    attn_implementation: str = "sdpa"
    """The attention kernel transformers is asked for: one the architecture supports (setup/preflight.py)."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "warning"]

    def raise_for_errors(self) -> None:
        if self.errors:
            body = "\n".join(f.render() for f in self.errors)
            raise PlanError(f"this setup cannot work; nothing was trained:\n{body}")

    def render(self) -> str:
        m = self.model
        lines = [f"loraflow plan: stage {self.config.stage}; {self.env.describe()}",
                 f"model: {m.path} ({m.model_type}, {m.num_layers} layers, {m.parameters / 1e6:.2f}M parameters)"
                 if m.inspected else f"model: {m.path} (not inspected: its config could not be read here)"]
        width = max(len(d.key) for d in self.decisions)
        for d in self.decisions:
            tag = f" [{d.rule}]" if d.rule else ""
            lines.append(f"  {d.key:<{width}}  {_show(d.value)}{tag}\n  {'':<{width}}    because {d.reason}")
        if self.findings:
            lines.append("findings:")
            lines += ["  " + f.render().replace("\n", "\n  ") for f in self.findings]
        else:
            lines.append("findings: none")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.config.stage,
            "environment": {"device": self.env.device, "world_size": self.env.world_size,
                            "versions": {k: str(v) if v else None for k, v in self.env.versions.items()}},
            "decisions": [{"key": d.key, "value": _jsonable(d.value), "reason": d.reason, "rule": d.rule}
                          for d in self.decisions],
            "findings": [{"rule": f.rule.id, "verdict": f.verdict, "title": f.rule.title,
                          "changes": {k: _jsonable(v) for k, v in f.changes.items()}} for f in self.findings],
        }


def _show(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    return str(value)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return _show(value)


def resolve_train_modules(config: Config, info: ModelInfo) -> list[str]:
    """adapter.train_modules -> full module names (PEFT modules_to_save), or a ConfigError naming the bad entry."""
    names: list[str] = []
    problems: list[str] = []
    from loraflow.setup.adapters import module_names_matching

    if not info.inspected:
        return []  # `check` without the model: nothing to match against

    for entry in config.adapter.train_modules:
        if entry == "embeddings":
            names.append(info.embedding_name)
        elif entry == "lm_head":
            if info.lm_head_name is None:
                problems.append(f"adapter.train_modules: this {info.model_type} model has no output head to train.")
            else:
                names.append(info.lm_head_name)
        elif entry == "norms":
            names += info.norm_names
        else:
            found = module_names_matching(info, entry)
            if not found:
                kinds = sorted({n.rsplit(".", 1)[-1] for n in info.module_names if not n.rsplit(".", 1)[-1].isdigit()})
                problems.append(f"adapter.train_modules: `{entry}` matches no module of this model. Use one of "
                                f"{', '.join(TRAIN_MODULE_GROUPS)} or a module name suffix; this {info.model_type} "
                                f"model's module names are: {', '.join(kinds)} (linear: "
                                f"{', '.join(info.linear_names) or 'none'}).")
            names += found
    if problems:
        raise ConfigError(problems)
    return list(dict.fromkeys(names))


def _checkpoint_layers(config: Config, num_layers: int) -> list[int]:
    if not config.checkpointing.enabled:
        return []
    n = config.checkpointing.every_n_layers
    return [i for i in range(num_layers) if i % n == 0]  # transformers' every_n_layers semantics


def _precision(config: Config) -> tuple[list[str], torch.dtype, torch.dtype, torch.dtype | None, str]:
    """(problems, load dtype, trainable dtype, autocast dtype, reason)."""
    mode, asked, full = config.precision.mode, config.model.dtype, config.adapter.method == "full"
    problems: list[str] = []
    if mode == "fp32":
        if asked not in ("auto", "float32"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=fp32; use model.dtype=auto or "
                            "precision.mode=bf16-mixed.")
        return problems, torch.float32, torch.float32, None, "precision.mode=fp32: every tensor in float32"
    if mode == "bf16":
        if asked not in ("auto", "bfloat16"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=bf16 (pure bf16); use model.dtype=auto.")
        return problems, torch.bfloat16, torch.bfloat16, None, \
            "precision.mode=bf16: weights, adapters and optimizer state all in bfloat16"
    # bf16-mixed: frozen weights may be stored in bf16; anything the optimizer updates stays float32.
    if full and asked == "bfloat16":
        problems.append("model.dtype=bfloat16 contradicts full fine-tuning under precision.mode=bf16-mixed, which "
                        "keeps float32 master weights; use model.dtype=auto, or precision.mode=bf16 for pure bf16.")
    load = torch.float32 if (full or asked == "float32") else torch.bfloat16
    why = ("full fine-tuning keeps float32 master weights" if full else
           "frozen base weights are only read, so bfloat16 storage halves their memory")
    return problems, load, torch.float32, torch.bfloat16, \
        f"precision.mode=bf16-mixed: {why}; trainable parameters float32; matmuls under bfloat16 autocast"


def resolve_engine(config: Config, env: Environment) -> tuple[str, int, bool]:
    """(engine, ZeRO stage, offload) from parallel.* and the launch; a ConfigError for a contradiction."""
    p = config.parallel
    engine = p.engine
    if engine == "auto":
        deepspeed_asked = p.zero_stage is not None or p.deepspeed_config or "true" in (p.offload_optimizer,
                                                                                       p.offload_params)
        engine = "deepspeed" if deepspeed_asked else ("ddp" if env.world_size > 1 else "single")
    if engine == "single" and env.world_size > 1:
        raise ConfigError([f"parallel.engine=single, but {env.world_size} processes were launched (WORLD_SIZE="
                           f"{env.world_size}); set parallel.engine to ddp, deepspeed or fsdp2, or launch one "
                           "process."])
    if engine != "deepspeed":
        return engine, 0, False
    from loraflow.engines.deepspeed_config import deepspeed_settings

    ds = deepspeed_settings(config.parallel)
    if config.precision.mode == "bf16" and ds.stage >= 1:
        raise ConfigError([f"precision.mode=bf16 keeps weights, gradients and optimizer state in bfloat16, but "
                           f"DeepSpeed ZeRO-{ds.stage} always keeps fp32 master weights and gradients for loraflow's "
                           "optimizer, so it would train differently from one process. Use precision.mode="
                           "bf16-mixed, or parallel.zero_stage=0, or parallel.engine=fsdp2."])
    return engine, ds.stage, ds.offload_optimizer or ds.offload_params


def resolve_reference(config: Config) -> str | None:
    """The reference policy of dpo, grpo and ppo. With adapters it is the same model with its adapters switched
    off (no second copy); full fine-tuning needs a copy, or for DPO, whose pairs are fixed, log-probs computed
    once before training. GRPO and PPO score fresh samples every step, so they cannot precompute."""
    stage, full = config.stage, config.adapter.method == "full"
    if stage in ("sft", "rm") or (stage in ("grpo", "ppo") and config.rl.kl_coef == 0):
        return None
    if stage == "dpo":
        asked = config.dpo.reference
        return asked if asked != "auto" else ("precomputed" if full else "adapters-disabled")
    return "copy" if full else "adapters-disabled"


def normalized_setup(config: Config, env: Environment, info: ModelInfo, modules_to_save: list[str],
                     layers: list[int], reentrant: bool | None) -> Setup:
    """The setup as asked (with `auto` settled by the plan's defaults), before any rule fix: what a framework
    without loraflow's rules would run. The rules then decide what must change."""
    placement = "off" if not layers else ("all" if len(layers) == info.num_layers else "partial")
    lm_head = info.lm_head_name
    return Setup(
        stage=config.stage,
        adapter=config.adapter.method,
        matched_modules=None if config.adapter.method == "full" or not info.inspected else len(info.adapter_modules),
        embeddings_trainable=config.adapter.method == "full" or info.embedding_name in modules_to_save,
        lm_head_trainable=config.adapter.method == "full" or (lm_head is not None and (
            lm_head in modules_to_save or lm_head in info.adapter_modules)),
        tied_embeddings=info.tied_embeddings,
        checkpointing=placement,
        checkpoint_every_n=config.checkpointing.every_n_layers,
        reentrant=reentrant,
        checkpoint_impl="transformers",
        input_grad_hook=False,
        use_cache=info.use_cache_default,
        packing=config.data.packing,
        precision=config.precision.mode,
        world_size=env.world_size,
        versions=dict(env.versions),
        **_engine_fields(config, env),
    )


def _engine_fields(config: Config, env: Environment) -> dict[str, Any]:
    engine, stage, offload = resolve_engine(config, env)
    return dict(
        engine=engine, zero_stage=stage, offload=offload,
        find_unused_parameters=engine == "ddp" and config.parallel.find_unused_parameters == "true",
        # What HF/accelerate do under FSDP2: transformers' layer checkpointing, which encloses the sharded unit.
        checkpoint_outside_shard=engine == "fsdp2",
        # loraflow's FSDP2 layout for LoRA (DoRA reads its base weight after the base forward, so it stays in the
        # layer's unit): see engines/fsdp2.py.
        fsdp_frozen_units_separate=engine == "fsdp2" and config.adapter.method == "lora",
        # Rollouts, and exact-match evaluation, generate with the trained model.
        generation=config.stage in ("grpo", "ppo") or (config.stage in ("sft", "dpo") and has_eval_set(config.data)
                                                        and config.eval.generate),
        # Chosen and rejected (rm, dpo) go through one concatenated forward; the reference forward runs without
        # autograd, so it leaves nothing for the backward to meet (fsdp2-multi-forward-dtensor).
        forwards_per_step=1,
    )


def resolve(config: Config, env: Environment, info: ModelInfo | None = None) -> Plan:
    """Decide every choice of the run. Raises ConfigError for config problems; rule errors are findings
    (`check` prints them, `train` calls plan.raise_for_errors())."""
    if info is None:
        from loraflow.setup.model import inspect_model

        info = inspect_model(config)
    modules_to_save = resolve_train_modules(config, info) if config.adapter.method != "full" else []
    problems, load_dtype, trainable_dtype, autocast_dtype, precision_reason = _precision(config)
    if problems:
        raise ConfigError(problems)
    layers = _checkpoint_layers(config, info.num_layers)
    asked = config.checkpointing.reentrant
    reentrant = None if not layers else (asked == "true")
    naive = normalized_setup(config, env, info, modules_to_save, layers, reentrant)
    final, findings = evaluate(naive)
    changed_by = {key: f.rule.id for f in findings for key in f.changes}

    plan = Plan(config=config, env=env, model=info, setup=final, findings=findings, device=env.device,
                load_dtype=load_dtype, trainable_dtype=trainable_dtype, autocast_dtype=autocast_dtype,
                modules_to_save=modules_to_save, ensure_weight_tying=final.weight_tying_enforced,
                checkpoint_layers=layers, reentrant=final.reentrant, input_grad_hook=final.input_grad_hook,
                use_cache=False,
                checkpoint_in_engine=bool(layers) and final.engine == "fsdp2" and not final.checkpoint_outside_shard)
    plan.attn_implementation = info.attn_implementation
    if info.attn_implementation == "flash_attention_2" and env.device == "cpu":
        raise ConfigError(["model.attn_implementation=flash_attention_2 needs a CUDA GPU, and this run is on the "
                           "CPU. Set model.attn_implementation=auto (or sdpa, or eager)."])
    plan.head = {"rm": "score", "ppo": "value"}.get(config.stage, "lm")
    plan.reference = resolve_reference(config)
    from loraflow.phases import stage_phases

    plan.phases = stage_phases(config.stage, plan.reference, bool(config.rl.reward_model)
                               and config.stage in ("grpo", "ppo"), config.rl.updates_per_rollout)
    from loraflow.plan_reasons import explain_choices

    plan.decisions = explain_choices(plan, naive, changed_by, precision_reason)
    return plan
