"""resolve(config, environment) -> Plan: every concrete choice of a run, each with its reason.

This is the one decision function. It maps the config onto the normalized Combination (asked.py), lets the rule
registry apply its fixes and report its errors and warnings, and builds the frozen Plan that `train` executes and
`check` prints. Each area's choice and its reason live together in one module:

  precision.py      dtypes of frozen and trainable weights, autocast
  adapter.py        what trains and what is saved (adapters, modules trained in full, experts), the model's build
  towers.py         an image-text model's towers, blank images
  checkpointing.py  the recomputed layers and sub-blocks, reentrant mode, input-grad hook, KV cache
  engine.py         the engine and what it does (from the engine table's capabilities)
  logits.py         where the output head runs
  quantization.py   bitsandbytes settings and the k-bit preparation
  stage.py          loss, reference, phases, rollout
  rollout.py        an RL stage's rollout engine (hf or vLLM), its policy sync and the log-prob check
  rewards.py        where an RL stage's reward functions come from, the reward model's kind and how it scores
  packages.py       the optional packages the setup needs (DeepSpeed, bitsandbytes, vLLM), checked first

Nothing downstream re-decides: setup code and the engines read `plan.<choice>` (the engine's settings included)
and never the raw config for anything the plan covers.
"""

from __future__ import annotations

from loraflow.config.schema import Config
from loraflow.environment import Environment
from loraflow.plan.adapter import adapter_decisions, model_decisions, saves, saving_decisions, train_modules
from loraflow.plan.asked import asked_setup
from loraflow.plan.checkpointing import asked_reentrant, checkpoint_block, checkpoint_layers, decide_checkpointing
from loraflow.plan.context import Context
from loraflow.plan.engine import checkpoint_in_engine, engine_decisions, resolve_engine
from loraflow.plan.logits import decide_logits
from loraflow.plan.packages import require_packages
from loraflow.plan.precision import decide_precision
from loraflow.plan.quantization import decide_quantization
from loraflow.plan.rollout import DEFAULT_MAX_LORA_RANK, LOGPROB_BOUNDS  # the probes reproduce against them
from loraflow.plan.stage import decide_stage
from loraflow.plan.towers import blank_images, full_tower_roots, resolve_towers, tower_decisions
from loraflow.plan.types import Decision, Plan
from loraflow.rules import evaluate
from loraflow.setup.model import ModelInfo
from loraflow.stagespec import stage_spec

__all__ = ["DEFAULT_MAX_LORA_RANK", "Decision", "LOGPROB_BOUNDS", "Plan", "resolve"]


def resolve(config: Config, env: Environment, info: ModelInfo | None = None) -> Plan:
    """Decide every choice of the run. Raises ConfigError for config problems; rule errors are findings
    (`check` prints them, `train` calls plan.raise_for_errors())."""
    engine, deepspeed = resolve_engine(config, env)
    # A missing optional package refuses the setup before the model is even inspected: the same words for `check`
    # and `train`, instead of an import error inside the engine after the weights loaded.
    require_packages(config, env, engine)
    if info is None:
        from loraflow.setup.model import inspect_model

        info = inspect_model(config)
    # What the config asks, settled before the rules see it.
    modules_to_save = train_modules(config, info)
    precision = decide_precision(config)
    layers = checkpoint_layers(config, info.num_layers)
    towers = resolve_towers(config, info, layers)
    modules_to_save += [r for r in full_tower_roots(towers, info, config.adapter.method) if r not in modules_to_save]
    block = checkpoint_block(config, info)
    vision_layers = next((t.checkpoint_layers for t in towers if t.name == "vision"), [])
    asked = asked_setup(config, env, info, modules_to_save, layers, asked_reentrant(config, layers, vision_layers),
                        engine, deepspeed, precision.load, towers)
    # The rules' fixes, then every area's final choice with its reason.
    final, findings = evaluate(asked)
    ctx = Context(config, env, info, stage_spec(config.stage), asked, final,
                  {key: f.rule.id for f in findings for key in f.changes})
    in_engine = checkpoint_in_engine(ctx, layers, block)
    ckpt = decide_checkpointing(ctx, layers, block, in_engine)
    attention, model_choices = model_decisions(ctx)
    logits, logits_choice = decide_logits(ctx)
    quantization, quantization_choices = decide_quantization(ctx, precision.load, modules_to_save,
                                                             final.input_grad_hook)
    blank = blank_images(ctx)
    stage = decide_stage(ctx)
    decisions = [
        *engine_decisions(ctx, deepspeed, layers, ckpt.block, precision.autocast is not None),
        precision.decision,
        *model_choices,
        *quantization_choices,
        *adapter_decisions(ctx),
        *tower_decisions(ctx, towers, modules_to_save, blank),
        *saving_decisions(ctx, towers, modules_to_save),
        *ckpt.decisions,
        logits_choice,
        *ckpt.hooks,
        *stage.decisions,
    ]
    return Plan(config=config, env=env, model=info, setup=final, findings=findings, decisions=decisions,
                asked=asked, load_dtype=precision.load, trainable_dtype=precision.trainable,
                autocast_dtype=precision.autocast, modules_to_save=modules_to_save, checkpoint_layers=layers,
                checkpoint_in_engine=in_engine, checkpoint_block=ckpt.block,
                offload_activations=ckpt.offload_activations, reference=stage.reference, phases=stage.phases,
                attn_implementation=attention, deepspeed=deepspeed, logits=logits, quantization=quantization,
                towers=towers, vision_checkpoint_layers=list(vision_layers), blank_images=blank,
                saves=saves(config), rollout=stage.rollout, reward_model=stage.reward_model)
