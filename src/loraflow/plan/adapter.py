"""The adapter area: what trains (the adapters, modules trained in full beside them, the fused expert weights of a
mixture of experts), what stays frozen, and what a checkpoint saves."""

from __future__ import annotations

from loraflow.config.schema import EXPERTS_TARGET, Config
from loraflow.errors import ConfigError
from loraflow.plan.context import Context
from loraflow.plan.types import Decision
from loraflow.setup.model import ModelInfo

TRAIN_MODULE_GROUPS = ("embeddings", "lm_head", "norms")


def train_modules(config: Config, info: ModelInfo) -> list[str]:
    """adapter.train_modules -> full module names (PEFT modules_to_save), or a ConfigError naming the bad entry."""
    if config.adapter.method == "full" or not info.inspected:
        return []  # full: every weight trains; `check` without the model: nothing to match against
    from loraflow.setup.adapters import module_names_matching

    names: list[str] = []
    problems: list[str] = []
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


def adapter_decisions(ctx: Context) -> list[Decision]:
    """The adapter and what it reached, the mixture of experts' fused weights included."""
    return [_adapter(ctx), *_fused_weights(ctx)]


def _adapter(ctx: Context) -> Decision:
    a, info = ctx.config.adapter, ctx.model
    if a.method == "full":
        return Decision("adapter", "none (full fine-tuning)", "adapter.method=full: every weight trains")
    targets = ",".join(a.target_modules)
    n = len(info.adapter_modules)
    if not info.inspected:
        return Decision("adapter", f"{a.method} r={a.rank} alpha={a.alpha:g} on {targets}",
                        "model.path could not be inspected here, so the matched modules are unknown")
    if n == 0:
        return Decision("adapter", f"{a.method} on no module: adapter.target_modules={targets} matches nothing",
                        f"this {info.model_type} model's linear modules are "
                        f"{', '.join(info.linear_names) or 'none'}; set adapter.target_modules to some of "
                        "them, or to all-linear")
    kinds = sorted({m.rsplit(".", 1)[-1] for m in info.adapter_modules})
    value = f"{a.method} r={a.rank} alpha={a.alpha:g} dropout={a.dropout:g} on {n} modules ({', '.join(kinds)})"
    return Decision("adapter", value, f"adapter.target_modules={targets} matched {n} modules (PEFT's matching)")


def _fused_weights(ctx: Context) -> list[Decision]:
    """A mixture of experts says what happens to its fused expert weights: adapted where PEFT's matching wrapped
    them (`experts` in adapter.target_modules, or peft 0.21's all-linear on Mixtral, which maps its former expert
    Linears to parameters), frozen where it did not (it trained nothing there, silently, before)."""
    info = ctx.model
    fused = info.fused_weights
    if not fused or ctx.config.adapter.method == "full":
        return []
    adapted = set(info.adapter_modules)
    reached = {n: size for n, size in fused.items() if n in adapted}
    frozen = {n: size for n, size in fused.items() if n not in adapted}

    def blocks(which: dict[str, int]) -> str:
        size = sum(which.values())
        kinds = sorted({n.rsplit(".", 1)[-1] for n in which})
        share = f", {100 * size / info.parameters:.0f}% of the model" if info.parameters else ""
        return f"{len(which)} fused blocks ({', '.join(kinds)}; {size:,} weights{share})"

    if not frozen:
        asked = EXPERTS_TARGET in ctx.config.adapter.target_modules
        return [Decision("experts", f"adapted: {blocks(reached)}",
                         (f"adapter.target_modules names `{EXPERTS_TARGET}`, which stands for every fused expert "
                          "block" if asked else "adapter.target_modules reached these blocks (peft's all-linear maps "
                          "this family's former expert Linears to parameters)") +
                         ": peft's target_parameters wraps each fused parameter (one adapter slice per expert)")]
    return [Decision("experts", f"frozen: {blocks(frozen)}" + (f"; adapted: {blocks(reached)}" if reached else ""),
                     "these weights are parameters of three dimensions (one slice per expert), not Linear modules, "
                     "so module names in adapter.target_modules do not reach them; the Linear layers "
                     f"(attention, a shared expert) are adapted where targeted. Add `{EXPERTS_TARGET}` to "
                     "adapter.target_modules to adapt them (peft's target_parameters); adapter.method=full trains "
                     "them in full.")]


def saves(config: Config) -> str:
    """What checkpoints and the export hold: `adapter` (the trainable weights, PEFT's format) or `model`."""
    return "model" if config.adapter.method == "full" else "adapter"


def saving_decisions(ctx: Context, towers: list, modules_to_save: list[str]) -> list[Decision]:
    """What stays frozen, what a checkpoint holds, and whether trained tied embeddings stay tied."""
    saved = saves(ctx.config)
    out = [_freezing(ctx, towers, modules_to_save),
           Decision("saves", "every weight (the model)" if saved == "model" else "the trainable weights (a PEFT "
                    "adapter)", "full fine-tuning changes every weight" if saved == "model" else "only the "
                    "adapters and adapter.train_modules train; the base weights are model.path's")]
    if ctx.setup.weight_tying_enforced:
        out.append(Decision("ensure_weight_tying", True, "tied embeddings are trained",
                            ctx.rule("weight_tying_enforced")))
    return out


def _freezing(ctx: Context, towers: list, modules_to_save: list[str]) -> Decision:
    frozen = [r for t in towers if t.train == "frozen" and t.name != "language" for r in t.roots]
    if ctx.config.adapter.method == "full":
        if frozen:
            return Decision("freezing", f"{', '.join(frozen)} frozen; every other weight trains",
                            "full fine-tuning, with the frozen towers of the towers section")
        return Decision("freezing", "nothing frozen", "full fine-tuning")
    if modules_to_save:
        shown = modules_to_save if len(modules_to_save) <= 4 else \
            modules_to_save[:3] + [f"... {len(modules_to_save)} modules"]
        why = ("adapter.train_modules and the towers trained in full name modules trained in full" if towers
               else "adapter.train_modules names modules trained in full")
        return Decision("freezing", f"adapters + {', '.join(shown)} trainable; the rest frozen",
                        f"{why} (saved with the adapter)")
    return Decision("freezing", "adapters only; base weights frozen",
                    "adapter.train_modules is empty (DeepSpeed-Chat's only_optimize_lora)")


def model_decisions(ctx: Context) -> tuple[str, list[Decision]]:
    """How the model is built: the attention kernel (setup/preflight.py chose one the architecture supports) and
    the adapters merged into the base first."""
    info = ctx.model
    if info.attn_implementation == "flash_attention_2" and ctx.env.device == "cpu":
        raise ConfigError(["model.attn_implementation=flash_attention_2 needs a CUDA GPU, and this run is on the "
                           "CPU. Set model.attn_implementation=auto (or sdpa, or eager)."])
    if not info.inspected:
        return info.attn_implementation, []
    out = [Decision("attention", info.attn_implementation, info.attn_reason)]
    merged = ctx.config.model.merge_adapters
    if merged:
        notes = "; ".join(info.merge_notes)
        out.append(Decision("merge_adapters", merged, "their tensor shapes (safetensors headers) fit model.path"
                            + (f"; but {notes}" if notes else "")))
    return info.attn_implementation, out
