"""What an HF Trainer / TRL run trains, read from its options: the adapter (TRL's --use_peft, a script's own PEFT
flags or code), its target modules against the model (no module matched, no default for the model type), what is
quantized, and the image-text fields (which towers train, which the targets reach)."""

from __future__ import annotations

from loraflow.frontends import liger, vision
from loraflow.frontends import trl as trl_rel
from loraflow.frontends.argv import Command
from loraflow.frontends.common import Draft, as_list, embedding_targets
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.hf_options import Opt, Run, no_peft_flag, own_adapter, own_kbit_load
from loraflow.frontends.intent import TOWER_MODULE
from loraflow.frontends.table import parameter_targets
from loraflow.frontends.targets import check_targets, default_targets


def adapter(draft: Draft, run: Run) -> None:
    """Adapter: TRL scripts train a PEFT adapter only with --use_peft (ModelConfig.use_peft default False,
    trl/trainer/model_config.py). A plain Trainer script trains what it builds; with no PEFT flag, every weight."""
    opts, intent = run.opts, run.intent
    if intent.adapter and "use_peft" not in opts:
        draft.set("adapter", intent.adapter, f"{intent.sources['adapter']} (inferred from the script's own flag)")
        draft.note(f"{intent.sources['adapter']}: read as {intent.adapter} on a frozen base (a flag of the script "
                   "itself, not of the HF Trainer)" if intent.adapter != "full" else
                   f"{intent.sources['adapter']}: read as full fine-tuning")
    elif "use_peft" in opts or (run.trl and not own_kbit_load(run)):
        peft = run.on("use_peft")
        draft.set("adapter", ("dora" if run.on("use_dora") else "lora") if peft else "full",
                  opts["use_peft"].source if "use_peft" in opts else
                  "default (TRL trl/trainer/model_config.py: use_peft false, full fine-tuning)")
    elif not own_adapter(draft, run):
        no_peft_flag(draft)
    if "lora_target_parameters" in opts and draft.get("adapter") != "full":
        kind = parameter_targets(opts["lora_target_parameters"].value, opts["lora_target_parameters"].source)
        if kind:  # TRL ModelConfig.lora_target_parameters -> LoraConfig(target_parameters=...)
            draft.set("adapter_reads_base", kind, opts["lora_target_parameters"].source)
    if "lora_target_modules" in opts and opts["lora_target_modules"].value == []:
        draft.set("matched_modules", 0, opts["lora_target_modules"].source + " (empty list)")
    elif "lora_target_modules" in opts and draft.get("adapter") != "full":
        check_targets(draft, str((opts.get("model_name_or_path") or Opt("", "")).value),
                      as_list(opts["lora_target_modules"].value), opts["lora_target_modules"].source)
    elif intent.targets and draft.get("adapter") != "full":  # the script's own `--target_modules q_proj,v_proj`
        check_targets(draft, str((opts.get("model_name_or_path") or Opt("", "")).value), intent.targets,
                      intent.sources["targets"])
    elif draft.get("adapter") != "full" and ("peft_default_targets" in opts or (
            run.trl and "use_peft" in opts and not opts["use_peft"].derived and run.on("use_peft"))):
        default_targets(draft, str((opts.get("model_name_or_path") or Opt("", "")).value),
                        opts["peft_default_targets"].source if "peft_default_targets" in opts else
                        "--use_peft without --lora_target_modules (TRL ModelConfig.lora_target_modules: None)")
    if "lora_target_modules" in opts:
        liger.head_adapter(draft, opts["lora_target_modules"].value, opts["lora_target_modules"].source)
    if "lora_modules_to_save" in opts:
        embedding_targets(draft, as_list(opts["lora_modules_to_save"].value), opts["lora_modules_to_save"].source,
                          str((opts.get("model_name_or_path") or Opt("", "")).value))
    for bits in ("4", "8"):
        if run.on(f"load_in_{bits}bit"):
            draft.set("quantization", f"{bits}bit", opts[f"load_in_{bits}bit"].source)
    if intent.quantization and not draft.has("quantization"):
        draft.set("quantization", intent.quantization, f"{intent.sources['quantization']} (inferred)")
    if intent.frozen_modules:
        draft.set("frozen_modules", True, f"{intent.sources['frozen_modules']} (inferred: a tower stays frozen)")
    targets = opts.get("lora_target_modules")
    if intent.tower_adapters:
        draft.set("tower_adapters", True, f"{intent.sources['tower_adapters']} (inferred: adapters in the vision "
                  "tower)")
    elif targets is not None and TOWER_MODULE.search(" ".join(map(str, as_list(targets.value)))):
        draft.set("tower_adapters", True, f"{targets.source} (names vision-tower modules)")


# Where scripts name the model: TrainingArguments-style scripts and TRL (--model_name_or_path), Qwen2-VL-Finetune
# (--model_id), others (--model, --model_path, --base_model).
MODEL_KEYS = ("model_name_or_path", "model_id", "model", "model_path", "base_model", "pretrained_model_name_or_path",
              "model_name", "model_id_or_path")
LENGTH_KEYS = ("model_max_length", "max_seq_length", "max_length", "max_seq_len", "cutoff_len")


def image_text(draft: Draft, opts: dict[str, Opt], intent, cmd: Command | None) -> None:
    """The image-text fields, from the model's name and the script's tower flags (frontends/vision.py)."""
    key = next((k for k in MODEL_KEYS if k in opts), None)
    model = str((opts[key].value if key else "") or "")
    model_name_facts(draft, model, opts[key].source if key else "")
    vision.token_types_unknown(draft)  # by the model's type: Molmo2 is not among the towers vision.py knows
    if not vision.recognise(draft, model, opts[key].source if key else "", intent.sources.get("image_text")):
        return
    full = draft.get("adapter") == "full"
    if intent.towers_trainable:
        draft.set("towers_trainable", True, f"{intent.sources['towers_trainable']} (the vision encoder or projector "
                  "trains)")
    elif intent.projector_mlp_trains:
        draft.set("towers_trainable", True, f"{intent.sources['projector_mlp_trains']} (the projector trains)")
    elif full and not intent.frozen_modules:
        draft.set("towers_trainable", True, f"{draft.sources['adapter']}: full fine-tuning trains every tower")
    targets = opts.get("lora_target_modules")
    if intent.full_paths:
        draft.set("targets_all_towers", False, f"{intent.sources['full_paths']} (the script targets Linear modules by "
                  "their full path)")
    elif targets is not None and not full and vision.targets_reach_towers(model, as_list(targets.value)):
        # PEFT matches all-linear and a list of short names against every module of the model
        # (peft tuners_utils.py _maybe_include_all_linear_layers, check_target_module_exists).
        vision.targets_enter_tower(draft, targets.source, " (PEFT matches it against the whole model, vision "
                                   "encoder included)", model,
                                   None if intent.frozen_modules else as_list(targets.value))
    if cmd is not None and ((cmd.program == "trl" and cmd.subcommand == "sft") or cmd.program == "trl.scripts.sft"):
        # trl/scripts/sft.py passed the model id to SFTTrainer, which loads AutoModelForCausalLM, up to 0.15; from
        # 0.16 the script loads image-text configs with AutoModelForImageTextToText (TRL commit e4e5671, PR #3070).
        old = not trl_rel.since(draft, "0.16.0")
        draft.set("causal_lm_class", old, "trl sft < 0.16 hands the model id to SFTTrainer (AutoModelForCausalLM)"
                  if old else "trl sft >= 0.16 loads image-text models with AutoModelForImageTextToText "
                  "(trl/scripts/sft.py)")
    vision.data_unknowns(draft, next((k for k in LENGTH_KEYS if k in opts), ""))
