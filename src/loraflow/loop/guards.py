"""Runtime guards: the checks that catch, on step one, what the plan could not rule out.

- before every backward: the model (every module of it) is in train mode;
- after the first backward: every trainable parameter has a finite gradient and every adapter module received a
  non-zero one (an adapter that never gets a gradient never learns, and nothing else would say so);
- after the first optimizer step: frozen weights are unchanged.
A failure stops the run with the likely causes: the guard names the symptom it observed and the rule registry
says which rules show as it (Rule.symptoms); no rule id is written here.
"""

from __future__ import annotations

import torch

from loraflow.errors import GuardError
from loraflow.rules import Rule, rules_for_symptom
from loraflow.setup.adapters import adapter_modules


def _likely(symptoms: list[str], plan=None) -> list[Rule]:
    """The rules behind the observed symptoms, each once, in the order the symptoms were observed; with a plan,
    only those whose conditions hold for this run as asked or as planned (a rule about checkpointing is no cause
    in a run without it)."""
    rules = {r.id: r for symptom in symptoms for r in rules_for_symptom(symptom)}
    setups = [s for s in (getattr(plan, "asked", None), getattr(plan, "setup", None)) if s is not None]
    if setups:
        rules = {i: r for i, r in rules.items() if any(r.applies(s) for s in setups)}
    return list(rules.values())


def _causes(rules: list[Rule], fixes: bool = True) -> str:
    # `  - [id] ...`: the line shape `loraflow explain` reads back from a train.log (explain/own.py).
    return "\n".join(f"  - [{rule.id}] {rule.cause}" + (f" Fix: {rule.fix}" if fixes else "") for rule in rules)


def assert_train_mode(model: torch.nn.Module) -> None:
    """Backward through a module in eval mode trains with eval-time behaviour (dropout off) and hits the rules of
    symptom `eval-mode-at-backward` (transformers' checkpointing skipped; engines that assert on it); RLHF loops
    that generate in eval mode and forget to switch back hit it."""
    if model.training:
        stale = [n for n, m in model.named_modules() if not m.training and any(True for _ in m.parameters())]
        if not stale:
            return
        where = f"submodule {stale[0]}" + (f" and {len(stale) - 1} more" if len(stale) > 1 else "")
    else:
        where = "the model"
    rules = _likely(["eval-mode-at-backward"])
    # The ids in one bracket on the first line: `loraflow explain` reads them from there (explain/own.py).
    raise GuardError(f"{where} is in eval mode at backward [{', '.join(r.id for r in rules)}]. Call model.train() "
                     f"after generation or evaluation and before computing the loss.\nWhat it breaks:\n"
                     f"{_causes(rules, fixes=False)}")  # the one fix is the line above


def _imageless(plan, images: int | None):
    """A predicate on parameter names: in the vision encoder or projector of an image-text model whose first step
    held no image, where no gradient is the data's doing (text-only samples), not a setup's."""
    if images is None or images > 0 or not getattr(plan, "towers", None):
        return lambda name: False
    from loraflow.setup.towers import tower_of

    towers = {t.name: t for t in plan.towers}
    return lambda name: tower_of(name, towers) in ("vision", "projector")


def check_first_gradients(model: torch.nn.Module, plan, grads: dict[str, torch.Tensor | None] | None = None,
                          images: int | None = None) -> None:
    """After the first backward (all accumulated micro-batches), before the optimizer step. `grads` are the full
    gradients by single-process parameter name (an engine gathers them from its shards); default: `.grad`.
    `images`: how many images the step's batches held on all ranks (None for a text model); without one, the
    vision side gets no (or a zero) gradient by design, and is named as such rather than checked."""
    import logging

    from loraflow.engines.base import clean_name

    if grads is None:
        grads = {clean_name(n): p.grad for n, p in model.named_parameters() if p.requires_grad}
    excused = _imageless(plan, images)
    non_finite = [n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()]
    silent = [n for n, g in grads.items() if excused(n) and (g is None or not torch.any(g))]
    grads = {n: g for n, g in grads.items() if not excused(n)}
    missing = [n for n, g in grads.items() if g is None]
    dead = []
    for name, module in adapter_modules(model, with_modules=True).items():
        names = [clean_name(f"{name}.{n}") for n, p in module.named_parameters() if p.requires_grad]
        names = [n for n in names if n in grads]
        if names and all(grads.get(n) is None or not torch.any(grads[n]) for n in names):
            dead.append(clean_name(name))
    if silent:
        logging.getLogger("loraflow").info(
            "first step: %d trainable parameters of the vision encoder and projector got no gradient because its "
            "batches held no image (text-only samples), so the vision side did not run; they learn on steps with "
            "images (first: %s)", len(silent), silent[0])
    problems = []
    if missing:
        problems.append(f"{len(missing)} trainable parameters got no gradient (first: {missing[0]}).")
    if dead:
        problems.append(f"{len(dead)} adapter modules got an all-zero gradient (first: {dead[0]}).")
    if non_finite:
        problems.append(f"{len(non_finite)} parameters have non-finite gradients (first: {non_finite[0]}). Lower "
                        "train.learning_rate, check the data for empty or huge samples, or use precision.mode=fp32.")
    if not problems:
        return
    # The symptom, from what was observed; the registry names the rules behind it.
    symptoms = []
    if missing and plan.checkpoint_layers and plan.reentrant:
        symptoms.append("no-gradient-reentrant")
    if dead:  # a gradient path that exists but carries exactly zero: stale keys read during a recompute
        symptoms.append("zero-adapter-gradient")
    if missing and not symptoms:
        symptoms.append("no-gradient")
    rules = _likely(symptoms, plan)
    layers = f" Checkpointed layers: {plan.checkpoint_layers}, reentrant={plan.reentrant}, input-grad hook=" \
             f"{plan.input_grad_hook}." if plan.checkpoint_layers else ""
    causes = f"\nLikely causes:\n{_causes(rules)}" if rules else (
        "\nNo rule of loraflow's registry holds for this setup, so this is not a known conflict: please report it "
        "with this log.")
    raise GuardError("gradient check after the first backward failed: " + " ".join(problems) + layers + causes)


class FrozenWeights:
    """Fingerprints of the frozen parameters, to prove the first optimizer step left them alone. Two sums over
    each tensor's bytes, one weighted by position: any update changes them, and storing them costs two numbers per
    tensor instead of a copy of the model. Bytes, not values: a 4-bit weight packed into float storage (QLoRA under
    FSDP2 or ZeRO-3) holds arbitrary bit patterns, NaNs among them, which never compare equal as floats."""

    def __init__(self, model: torch.nn.Module, local=lambda p: p.detach()):
        # `local`: the part of a parameter this rank stores (its shard under ZeRO-3 or FSDP2); each rank checks
        # its own part, so together they check every frozen weight without gathering any.
        self.local = local
        self.prints = {n: self._print(local(p)) for n, p in model.named_parameters() if not p.requires_grad}

    @staticmethod
    @torch.no_grad()
    def _print(p: torch.Tensor) -> tuple[int, int]:
        if p.numel() == 0:
            return 0, 0
        raw = p.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
        weights = torch.arange(raw.numel(), dtype=torch.int64, device=raw.device) % 251 + 1
        return int(raw.sum()), int((raw * weights).sum())

    def changed(self, model: torch.nn.Module) -> list[str]:
        """The frozen parameters whose bytes differ from their fingerprints."""
        params = dict(model.named_parameters())
        return [n for n, fp in self.prints.items() if n in params and self._print(self.local(params[n])) != fp]

    def assert_unchanged(self, model: torch.nn.Module) -> None:
        changed = self.changed(model)
        if changed:
            raise GuardError(f"{len(changed)} frozen parameters changed in the first optimizer step (first: "
                             f"{changed[0]}). Something outside the optimizer of trainable parameters writes to "
                             "base weights; this is a loraflow bug: please report it with the plan.")
