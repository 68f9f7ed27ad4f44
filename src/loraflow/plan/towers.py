"""The plan's per-tower choices for an image-text model: what trains in the vision encoder, the projector and the
language model, with which adapter rank, and which of their layers recompute in backward.

The language model's layers follow the checkpointing section (plan.checkpoint_layers); the vision encoder's are
all or none (towers.vision.checkpointing); the projector has none. A tower trained in full is one of PEFT's
modules_to_save, so its weights are saved beside the adapter and reload with PeftModel.from_pretrained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.families import TOWER_NAMES
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.setup.model import ModelInfo


@dataclass
class TowerPlan:
    name: str
    train: str
    """frozen, full or adapter."""
    roots: list[str]
    layers: int
    parameters: int
    rank: int = 0
    alpha: float = 0.0
    modules: list[str] = field(default_factory=list)
    """Adapted: the module names the tower's targets matched (inside this tower only)."""
    checkpoint_layers: list[int] = field(default_factory=list)

    def describe(self) -> str:
        what = {"frozen": "frozen", "full": "trained in full (saved with the adapter)"}.get(
            self.train, f"adapter r={self.rank} alpha={self.alpha:g} on {len(self.modules)} modules")
        recompute = ""
        if self.layers:
            chosen = self.checkpoint_layers
            recompute = "; recomputes " + ("no layer" if not chosen else "every layer" if len(chosen) == self.layers
                                           else "layers " + ", ".join(map(str, chosen)))
        return f"{self.name}: {what} ({self.parameters / 1e6:.2f}M parameters, {self.layers} layers{recompute})"


def resolve_towers(config: Config, info: ModelInfo, language_layers: list[int]) -> list[TowerPlan]:
    """One TowerPlan per tower of an image-text model (empty for a text model, which must leave `towers` alone).
    Raises ConfigError naming the key for a choice that matches nothing."""
    if not info.image_text:
        changed = config.towers.changed()
        if changed and info.inspected:
            raise ConfigError([f"{changed[0]}: this {info.model_type} model is text-only, so it has no vision "
                               "encoder or projector to choose for; remove the towers section."])
        return []
    a = config.adapter
    vision_recompute = {"auto": config.checkpointing.enabled, "true": True, "false": False}[
        config.towers.vision.checkpointing]
    out: list[TowerPlan] = []
    problems: list[str] = []
    for name in TOWER_NAMES:
        tower, asked = info.towers[name], getattr(config.towers, name)
        train = config.towers.train_of(name, a.method)
        plan = TowerPlan(name, train, list(tower.roots), len(tower.layers), tower.parameters)
        if name == "projector" and not tower.roots and train != "frozen":
            problems.append(f"towers.projector.train={train}: this {info.model_type} model has no separate projector "
                            "(none of loraflow/families.py PROJECTOR_NAMES); leave towers.projector.train=auto.")
        if train == "adapter":
            plan.rank, plan.alpha = asked.rank or a.rank, asked.alpha or a.alpha
            plan.modules = info.tower_modules.get(name, [])
            if not plan.modules:
                key = f"towers.{name}.target_modules" if asked.target_modules else "adapter.target_modules"
                problems.append(f"{key}={asked.target_modules or a.target_modules} matches no module of the {name} "
                                f"tower; name its linear layers, or use all-linear.")
        if name == "language":
            plan.checkpoint_layers = list(language_layers)
        elif name == "vision" and vision_recompute:
            plan.checkpoint_layers = list(range(plan.layers))
        out.append(plan)
    if config.data.packing:
        problems.append("data.packing=true: image-text rows are not packed (each row keeps its own images, and "
                        "Qwen2-VL's 3-D positions cannot restart inside a row); set data.packing=false.")
    if problems:
        raise ConfigError(problems)
    return out


def full_tower_roots(towers: list[TowerPlan], info: ModelInfo, adapter_method: str) -> list[str]:
    """The modules_to_save that train whole towers beside adapters (none under full fine-tuning, where every
    unfrozen weight trains anyway); a root inside another one listed (Qwen2-VL's merger in its vision encoder)
    is left to its ancestor's copy. A tower holding modules whose output its forward never reads (info.unreached) is covered by
    its other sub-modules instead, so PEFT's copy (and the saved adapter) holds only weights that train."""
    if adapter_method == "full":
        return []
    roots = [r for t in towers if t.train == "full" for r in t.roots]
    roots = [r for r in roots if not any(r != o and r.startswith(o + ".") for o in roots)]
    return [m for r in roots for m in _covering(r, info.module_names, info.unreached)]


def _covering(root: str, names: list[str], unreached: list[str]) -> list[str]:
    """The fewest modules under `root` that hold every one of its modules except the unreached ones."""
    inside = [u for u in unreached if u == root or u.startswith(root + ".")]
    if not inside:
        return [root]
    if root in inside:
        return []
    depth = root.count(".") + 1
    children = [n for n in names if n.startswith(root + ".") and n.count(".") == depth]
    return [m for child in children for m in _covering(child, names, unreached)]


def blank_images(ctx: Context) -> bool:
    """Whether a micro-batch without an image gets one blank image. Beyond the rules' cases (ZeRO-1/2): ranks that
    run the same modules keep every engine's collectives and gradient buckets alike, at the cost of one blank
    image."""
    return ctx.setup.image_every_rank or (ctx.model.image_text and ctx.env.world_size > 1)


def tower_decisions(ctx: Context, towers: list[TowerPlan], modules_to_save: list[str],
                    blank: bool) -> list[Decision]:
    """An image-text model's towers: what trains in each and where it recomputes."""
    config, info = ctx.config, ctx.model
    out = []
    for t in towers:
        asked = getattr(config.towers, t.name)
        why = (f"towers.{t.name}.train={asked.train}" if asked.train != "auto" else
               f"towers.{t.name}.train=auto: " + ("the language model follows adapter.method" if t.name == "language"
                                                  else "under adapters, the vision side stays frozen unless asked"
                                                  if config.adapter.method != "full" else
                                                  "adapter.method=full trains every tower"))
        if t.train == "full" and config.adapter.method != "full":
            copies = [m for m in modules_to_save if any(m == r or m.startswith(r + ".") for r in t.roots)]
            why += f"; trained as PEFT modules_to_save ({', '.join(copies)}), copies saved in the adapter"
        if t.name == "vision" and t.layers:
            c = asked.checkpointing
            why += (f"; its layers recompute: towers.vision.checkpointing={c}" + (
                f" follows checkpointing.enabled={str(config.checkpointing.enabled).lower()}" if c == "auto"
                else ""))
        if t.name == "vision" and info.unreached and t.train != "frozen":
            why += (f"; {', '.join(info.unreached)} are never read by the image-text forward (the features "
                    "are taken before them), so they get no gradient and stay frozen (in the tower's dtype)")
        out.append(Decision(f"tower {t.name}", t.describe().split(": ", 1)[1], why))
    if towers:
        out.append(Decision("image truncation", "a sample whose image tokens data.max_length would cut is dropped",
                            "the model needs one placeholder per image feature", ctx.rule("image_safe_truncation")))
    if blank:
        out.append(Decision("blank images", "a micro-batch without an image gets one blank image, masked out of "
                            "attention and loss", "every rank must run the vision encoder each step: sharded towers "
                            "gather by collectives and DDP waits for every trainable weight's gradient",
                            ctx.rule("image_every_rank")))
    return out
