"""The human side of the plan: one Decision (value + reason, + rule id when a rule set it) per choice.

Kept apart from plan.py so the decision logic stays short; nothing here changes a choice, it only explains it.
"""

from __future__ import annotations

from loraflow.plan import Decision, Plan
from loraflow.rules import Setup


def _adapter(plan: Plan) -> Decision:
    a = plan.config.adapter
    if a.method == "full":
        return Decision("adapter", "none (full fine-tuning)", "adapter.method=full: every weight trains")
    targets = ",".join(a.target_modules)
    n = len(plan.model.adapter_modules)
    kinds = sorted({m.rsplit(".", 1)[-1] for m in plan.model.adapter_modules})
    value = f"{a.method} r={a.rank} alpha={a.alpha:g} dropout={a.dropout:g} on {n} modules ({', '.join(kinds)})"
    return Decision("adapter", value, f"adapter.target_modules={targets} matched {n} modules (PEFT's matching)")


def _freezing(plan: Plan) -> Decision:
    if plan.config.adapter.method == "full":
        return Decision("freezing", "nothing frozen", "full fine-tuning")
    if plan.modules_to_save:
        shown = plan.modules_to_save if len(plan.modules_to_save) <= 4 else \
            plan.modules_to_save[:3] + [f"... {len(plan.modules_to_save)} modules"]
        return Decision("freezing", f"adapters + {', '.join(shown)} trainable; the rest frozen",
                        "adapter.train_modules names modules trained in full (saved with the adapter)")
    return Decision("freezing", "adapters only; base weights frozen",
                    "adapter.train_modules is empty (DeepSpeed-Chat's only_optimize_lora)")


def _checkpointing(plan: Plan) -> list[Decision]:
    c = plan.config.checkpointing
    if not plan.checkpoint_layers:
        return [Decision("checkpointing", "off", "checkpointing.enabled=false: activations are kept for backward")]
    n, total = len(plan.checkpoint_layers), plan.model.num_layers
    where = "every layer" if n == total else \
        f"layers {', '.join(map(str, plan.checkpoint_layers))} of {total} (every {c.every_n_layers})"
    out = [Decision("checkpointing", where, "checkpointing.enabled=true with checkpointing.every_n_layers="
                    f"{c.every_n_layers}, through transformers' own layer checkpointing")]
    if c.reentrant == "auto":
        out.append(Decision("checkpointing.reentrant", False,
                            "chosen: non-reentrant records gradients for weights that are not layer inputs "
                            "(the adapters), so it needs no input-grad hook and is exact with partial "
                            "checkpointing; it is torch's recommended mode"))
    else:
        out.append(Decision("checkpointing.reentrant", plan.reentrant,
                            f"requested (checkpointing.reentrant={c.reentrant})"))
    return out


def _input_grad_hook(plan: Plan, naive: Setup, changed_by: dict[str, str]) -> Decision:
    if plan.input_grad_hook:
        return Decision("input_grad_hook", True, "reentrant checkpointing only records a graph when a layer "
                        "input requires grad and the embeddings are frozen", changed_by.get("input_grad_hook"))
    if not plan.checkpoint_layers:
        why = "no checkpointing, so autograd records every layer"
    elif naive.embedding_output_requires_grad:
        why = "the embedding output already requires grad (embeddings train)"
    else:
        why = "non-reentrant checkpointing tracks the adapter weights directly"
    return Decision("input_grad_hook", False, why)


def _use_cache(plan: Plan, naive: Setup, changed_by: dict[str, str]) -> Decision:
    rule = changed_by.get("use_cache")
    if rule:
        return Decision("use_cache", False, f"the model's default is {naive.use_cache}; training must not write a "
                        "KV cache here", rule)
    return Decision("use_cache", False, f"the model's default is {naive.use_cache}, but training never reads the "
                    "KV cache; turning it off saves its memory and keeps the forward free of cache state")


def explain_choices(plan: Plan, naive: Setup, changed_by: dict[str, str], precision_reason: str) -> list[Decision]:
    cfg = plan.config
    out = [
        Decision("device", plan.device, "single process on the only device available" if plan.device == "cpu"
                 else "single process on the first accelerator"),
        Decision("precision", f"load {_dt(plan.load_dtype)}, trainable {_dt(plan.trainable_dtype)}, autocast "
                 f"{_dt(plan.autocast_dtype) if plan.autocast_dtype else 'off'}", precision_reason),
        _adapter(plan),
        _freezing(plan),
    ]
    if plan.ensure_weight_tying:
        out.append(Decision("ensure_weight_tying", True, "tied embeddings are trained",
                            changed_by.get("weight_tying_enforced")))
    out += _checkpointing(plan)
    out.append(_input_grad_hook(plan, naive, changed_by))
    out.append(_use_cache(plan, naive, changed_by))
    out.append(Decision("loss", "sum over completion tokens / completion tokens in the optimizer step",
                        "only assistant/completion tokens are learned; normalising by the whole step's tokens "
                        "makes gradient accumulation exact (micro-batch 1 x 4 = 4 x 1)"))
    out.append(Decision("packing", cfg.data.packing, "data.packing; position ids restart per sample so packed "
                        "samples never attend to each other" if cfg.data.packing else "data.packing=false: one "
                        "sample per row, right-padded"))
    return out


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")
