"""The plan's types: a Decision (value + reason, + the rule that set it) and the Plan `resolve` returns, which
`train` executes, `check` prints and the engines read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from loraflow.config.schema import Config
from loraflow.engines.deepspeed_config import DeepSpeedSettings
from loraflow.environment import Environment
from loraflow.errors import PlanError
from loraflow.losses.logprobs import FULL, HeadMode
from loraflow.rules import Combination, Finding
from loraflow.setup.model import ModelInfo
from loraflow.setup.quantize import Quantization
from loraflow.stagespec import stage_spec


@dataclass
class Decision:
    key: str
    value: Any
    reason: str
    rule: str | None = None


@dataclass(frozen=True)
class Plan:
    """Every choice of a run, built once by `resolve` and never changed (frozen): each area of plan/ decides its
    values and words their reasons (`decisions`). Facts that another object already holds (the device, the final
    reentrant mode and hook, the stage's head) are properties reading it, not copies."""
    config: Config
    env: Environment
    model: ModelInfo
    setup: Combination
    findings: list[Finding]
    decisions: list[Decision] = field(default_factory=list)
    asked: Combination | None = None
    """The setup as asked, before the rules' fixes (the guards name rules whose conditions hold on either)."""
    # The typed choices that setup code executes.
    load_dtype: torch.dtype = torch.float32
    trainable_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    modules_to_save: list[str] = field(default_factory=list)
    checkpoint_layers: list[int] = field(default_factory=list)
    checkpoint_in_engine: bool = False
    """FSDP2 with checkpointing inside the sharded unit: the engine wraps the layers, not transformers."""
    checkpoint_block: str | None = None
    """The child of each checkpointed layer that recomputes (checkpointing.granularity=mlp/attention: e.g. `mlp`,
    `self_attn`); None recomputes the whole layer."""
    offload_activations: bool = False
    """Tensors saved for backward go to CPU memory during the forward (setup/saved_tensors.py); False on a CPU
    device, where they are already there."""
    reference: str | None = None
    """How the stage gets reference log-probs: adapters-disabled, copy, precomputed, or None (no reference)."""
    phases: list = field(default_factory=list)
    """The phases of one step with each model's mode (phases.Phase)."""
    attn_implementation: str = "sdpa"
    """The attention kernel transformers is asked for: one the architecture supports (setup/preflight.py)."""
    deepspeed: DeepSpeedSettings | None = None
    """The DeepSpeed engine's settings (stage, offload, the user's JSON checked), resolved once; None for the other
    engines."""
    logits: HeadMode = FULL
    """Where the output head runs (losses/logprobs.py): at the learned positions only, in chunks, or everywhere."""
    quantization: Quantization | None = None
    """The base's bitsandbytes quantization (QLoRA): method, compute and storage dtypes, the modules left
    unquantized; None loads it in load_dtype."""
    towers: list = field(default_factory=list)
    """An image-text model's TowerPlan per tower (plan/towers.py): what trains in each, and its recompute."""
    vision_checkpoint_layers: list[int] = field(default_factory=list)
    """The vision encoder's layers that recompute in backward (indices into checkpointing.vision_layers)."""
    blank_images: bool = False
    """Image-text models on several ranks: a micro-batch without an image gets one blank image, masked out of
    attention and loss, so every rank runs the vision encoder (rules zero3-vision-skipped, ddp-unused-vision-tower)."""
    rollout: Any = None
    """An RL stage's rollout engine (plan/rollout.py RolloutPlan: hf or vllm, the sync, the check's bound); None
    for stages that do not sample."""
    reward_model: Any = None
    """rl.reward_model's kind and location (plan/rewards.py RewardModelPlan), which rl/reward_model.py loads; None
    without one."""
    saves: str = "adapter"
    """What checkpoints and the export hold, and the export's directory name: `adapter` (the trainable weights, in
    PEFT's format) or `model` (every weight: full fine-tuning)."""

    @property
    def device(self) -> str:
        return self.env.device

    @property
    def reentrant(self) -> bool | None:
        """The checkpointing mode after the rules' fixes (None: nothing recomputes)."""
        return self.setup.reentrant

    @property
    def input_grad_hook(self) -> bool:
        return self.setup.input_grad_hook

    @property
    def ensure_weight_tying(self) -> bool:
        """PEFT's ensure_weight_tying: trained copies of tied embeddings stay tied (a rule's fix)."""
        return self.setup.weight_tying_enforced

    @property
    def head(self) -> str:
        """`lm` (a causal LM), `score` (a scalar score head: the reward model) or `value` (a causal LM with PPO's
        value head): the stage's."""
        return stage_spec(self.config.stage).head

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "warning"]

    def raise_for_errors(self) -> None:
        if self.errors:
            body = "\n".join(f.render() for f in self.errors)
            raise PlanError(f"this setup cannot work; nothing was trained:\n{body}", findings=self.errors)

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
