"""DeepSpeed config JSON: read on its own (`loraflow check --framework deepspeed ds.json`) and wherever another
framework names one (`--deepspeed ds.json`, `deepspeed: path` in YAML, ms-swift's `--deepspeed zero3`).

Values "auto" are filled by the HF Trainer from its own flags (transformers integrations/deepspeed.py fill_match:
bf16.enabled <- --bf16, fp16.enabled <- --fp16); the caller resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import keys
from loraflow.frontends.argv import resolve_path
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import (
    OFFLOAD_IN_NAME,
    STAGE_IN_NAME,
    Draft,
    as_bool,
    at_least,
    finish_world,
    int_value,
    load_mapping,
    mapping_value,
)

NAME = "deepspeed"
FLAGS = {"zero_stage": "zero_optimization.stage",
         "offload": "zero_optimization.offload_optimizer.device / offload_param.device",
         "precision": "bf16.enabled / fp16.enabled",
         "adapter_save_gather": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
         "generation_gather": "hybrid_engine.enabled", "engine": "the DeepSpeed launcher"}


def _known(stage: int, opt: bool = False, param: bool = False, bf16: Any = "auto", gather: bool = False,
           auto_bucket: bool = False) -> dict:
    zero: dict[str, Any] = {"stage": stage}
    if auto_bucket:  # the shipped stage-3 files leave it to the trainer, which fills it from the hidden size
        zero["stage3_prefetch_bucket_size"] = "auto"
    if opt:
        zero["offload_optimizer"] = {"device": "cpu"}
    if param:
        zero["offload_param"] = {"device": "cpu"}
    if gather:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {"zero_optimization": zero, "bf16": {"enabled": bf16}, "fp16": {"enabled": "auto" if bf16 == "auto" else
                                                                              False}}


# Configs the frameworks ship, by file name, for when the path is relative to a checkout that is not here.
WELL_KNOWN: dict[str, tuple[dict, str]] = {
    # LLaMA-Factory examples/deepspeed/*.json
    "ds_z0_config.json": (_known(0), "LLaMA-Factory examples/deepspeed/ds_z0_config.json"),
    "ds_z2_config.json": (_known(2), "LLaMA-Factory examples/deepspeed/ds_z2_config.json"),
    "ds_z2_autotp_config.json": (_known(2), "LLaMA-Factory examples/deepspeed/ds_z2_autotp_config.json"),
    "ds_z2_offload_config.json": (_known(2, opt=True), "LLaMA-Factory examples/deepspeed/ds_z2_offload_config.json"),
    "ds_z3_config.json": (_known(3, gather=True, auto_bucket=True),
                          "LLaMA-Factory examples/deepspeed/ds_z3_config.json"),
    "ds_z3_fp8_config.json": (_known(3, opt=True, gather=True),
                              "LLaMA-Factory examples/deepspeed/ds_z3_fp8_config.json"),
    "ds_z3_offload_config.json": (_known(3, opt=True, param=True, gather=True, auto_bucket=True),
                                  "LLaMA-Factory examples/deepspeed/ds_z3_offload_config.json"),
    # axolotl deepspeed_configs/*.json
    "zero1.json": (_known(1), "axolotl deepspeed_configs/zero1.json"),
    "zero1_torch_compile.json": (_known(1), "axolotl deepspeed_configs/zero1_torch_compile.json"),
    "zero2.json": (_known(2, opt=True), "axolotl deepspeed_configs/zero2.json"),
    "zero2_torch_compile.json": (_known(2, opt=True), "axolotl deepspeed_configs/zero2_torch_compile.json"),
    "zero3.json": (_known(3, gather=True), "axolotl deepspeed_configs/zero3.json"),
    "zero3_bf16.json": (_known(3, bf16=True, gather=True), "axolotl deepspeed_configs/zero3_bf16.json"),
    "zero3_bf16_cpuoffload_all.json": (_known(3, opt=True, param=True, bf16=True, gather=True),
                                       "axolotl deepspeed_configs/zero3_bf16_cpuoffload_all.json"),
    "zero3_bf16_cpuoffload_params.json": (_known(3, param=True, bf16=True, gather=True),
                                          "axolotl deepspeed_configs/zero3_bf16_cpuoffload_params.json"),
}
# ms-swift's `--deepspeed NAME` picks swift/config/NAME.json from the installed package (swift/arguments/sft_args.py).
SWIFT_NAMES: dict[str, tuple[dict, str]] = {
    "zero0": (_known(0), "ms-swift swift/config/zero0.json"),
    "zero1": (_known(1), "ms-swift swift/config/zero1.json"),
    "zero2": (_known(2), "ms-swift swift/config/zero2.json"),
    "zero2_offload": (_known(2, opt=True), "ms-swift swift/config/zero2_offload.json"),
    "zero3": (_known(3, gather=True, auto_bucket=True), "ms-swift swift/config/zero3.json"),
    "zero3_offload": (_known(3, opt=True, param=True, gather=True, auto_bucket=True),
                      "ms-swift swift/config/zero3_offload.json"),
    # ms-swift v1.5.4 - v2.6 (swift/llm/ds_config/)
    "default-zero2": (_known(2), "ms-swift 1.x/2.x swift/llm/ds_config/zero2.json"),
    "default-zero3": (_known(3, gather=True, auto_bucket=True), "ms-swift 1.x/2.x swift/llm/ds_config/zero3.json"),
}


@dataclass
class DeepSpeedConfig:
    config: dict[str, Any]
    label: str
    """The path read, or `<name> (inferred from the name: upstream file)`."""
    notes: list[str] = field(default_factory=list)
    unsure: tuple[str, ...] = ()
    """What neither the file (absent) nor its name says: `stage`, `gather`."""


def infer_from_name(ref: str) -> tuple[dict, tuple[str, ...], str]:
    """A config inferred from a missing file's name: the ZeRO stage and offload it names, DeepSpeed's defaults for
    the rest. Returns (config, what stays unknown, what was inferred in words)."""
    name = Path(ref).name.lower()
    m = STAGE_IN_NAME.search(name)
    stage = int(next(g for g in m.groups() if g is not None)) if m else None
    offload = bool(OFFLOAD_IN_NAME.search(name))
    zero: dict[str, Any] = {}
    unsure = ["gather"]
    if stage is not None:
        zero["stage"] = stage
    else:
        unsure.append("stage")
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    half = "bf16" if "bf16" in name else "fp16" if "fp16" in name else None
    config: dict[str, Any] = {"zero_optimization": zero, "bf16": {"enabled": half == "bf16" or "auto"},
                              "fp16": {"enabled": half == "fp16" or "auto"}}
    said = [f"ZeRO stage {stage}" if stage is not None else "no ZeRO stage (every stage is evaluated)"]
    if offload:
        said.append("CPU offload")
    if half:
        said.append(half)
    return config, tuple(unsure), ", ".join(said)


def _load_as_deepspeed(path: Path, what: str, draft: Draft | None) -> dict[str, Any]:
    """The file as DeepSpeed itself loads it: DeepSpeedConfig (deepspeed/runtime/config.py) reads a path with hjson
    since PR #2783 (DeepSpeed 0.8.1), which accepts comments, trailing commas and a root without braces, and refuses
    duplicate keys. Strict JSON first (every framework reads that alike); hjson where DeepSpeed would accept more.
    Frameworks that hand the path to transformers (the HF Trainer, accelerate, LLaMA-Factory, Axolotl, ms-swift) read
    it with json.load (transformers integrations/deepspeed.py): they call this with no draft and get the JSON error."""
    try:
        return load_mapping(path, what)
    except LoraflowError as strict:
        try:
            import hjson
        except ImportError:  # DeepSpeed's own dependency: without it, the strict reading's error stands
            raise strict from None
        if draft is None or not at_least(draft, "deepspeed", "0.8.1"):
            raise
        try:
            data = hjson.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates(path))
        except (hjson.HjsonDecodeError, ValueError):
            raise strict from None
        if not isinstance(data, dict):
            raise strict from None
        draft.note(f"{path}: not strict JSON, read as DeepSpeed reads it (hjson: comments, trailing commas); "
                   "transformers' json.load would refuse it under the HF Trainer")
        return dict(data)


def _no_duplicates(path: Path):
    """deepspeed/runtime/config_utils.py dict_raise_error_on_duplicate_keys."""
    def pairs(items: list) -> dict:
        names = [k for k, _ in items]
        twice = sorted({k for k in names if names.count(k) > 1})
        if twice:
            raise LoraflowError(f"{path}: duplicate keys {', '.join(twice)}; DeepSpeed refuses them (\"Duplicate keys "
                                "in DeepSpeed config\").")
        return dict(items)
    return pairs


def read(ref: str | dict, flag: str, bases: tuple = (), names: dict | None = None,
         draft: Draft | None = None) -> DeepSpeedConfig:
    """The DeepSpeed config `ref` names: an inline dict, an existing file (relative to the working directory, then to
    each of `bases`), a name in `names` (ms-swift), or a well-known shipped file name. Anything else is an error.
    `draft`: given where DeepSpeed itself loads the file (a config alone), which reads it as DeepSpeed does."""
    if isinstance(ref, dict):
        return DeepSpeedConfig(ref, flag if ".py:" in flag else f"{flag} (inline)")  # a script's line names itself
    if not isinstance(ref, str):
        raise LoraflowError(f"{flag}: `{ref}` is not a DeepSpeed config; expected the path of its JSON file (or a "
                            f"mapping of its keys).")
    if names and ref in names:
        config, origin = names[ref]
        return DeepSpeedConfig(config, f"{flag} {ref}", [f"{flag} {ref}: the config {origin} (as shipped)"])
    path = resolve_path(ref, *bases)
    if path is not None:
        return DeepSpeedConfig(_load_as_deepspeed(path, f"DeepSpeed config ({flag})", draft), str(path))
    base = Path(ref).name
    if base in WELL_KNOWN:
        config, origin = WELL_KNOWN[base]
        return DeepSpeedConfig(config, f"{ref} (inferred)",
                               [f"{ref} is not on this machine; read as {origin} (as shipped upstream): ZeRO stage "
                                f"{config['zero_optimization']['stage']}. Run from the framework's checkout to check "
                                f"the file itself"])
    if not ref.strip() or ref.lstrip().startswith(("{", "[")):
        raise LoraflowError(f"{flag} {ref!r}: not a DeepSpeed config path.")
    config, unsure, said = infer_from_name(ref)
    where = ", ".join(str(b) for b in bases if b)
    return DeepSpeedConfig(config, f"{ref} (inferred from its name)",
                           [f"{flag} {ref}: no such file here (looked in the working directory"
                            f"{' and ' + where if where else ''}), so read from its name: {said}; DeepSpeed's defaults "
                            f"for the rest. Run from the directory the path is relative to for the file itself"],
                           unsure)


def _enabled(section: Any, where: str) -> Any:
    """True/False, or "auto" (filled later by the HF Trainer), or None when the section is absent."""
    if not isinstance(section, dict) or "enabled" not in section:
        return None
    value = section["enabled"]
    return "auto" if value == "auto" else as_bool(value, f"{where}.enabled")


def _misspelled(draft: Draft, key: str, label: str) -> None:
    """A top-level key DeepSpeed would read if spelled with underscores (`zero-optimization`): DeepSpeedConfig looks
    keys up by their exact names (deepspeed/runtime/zero/config.py get_zero_config: `if ZERO_OPTIMIZATION in
    param_dict`), so the section is ignored without a word."""
    spelled = key.replace("-", "_").lower()
    if spelled == key or spelled not in keys.DEEPSPEED_TOP:
        return
    said = f"{label}: `{key}` is not a key DeepSpeed reads (it reads `{spelled}`), so that section is ignored"
    if spelled == "zero_optimization":
        said += (": deepspeed.initialize runs it with ZeRO off (stage 0), and accelerate (the HF Trainer's DeepSpeed "
                 "path) refuses the file (\"Please specify the ZeRO optimization config in the DeepSpeed config\", "
                 "accelerate utils/dataclasses.py DeepSpeedPlugin)")
    draft.note(said + f". Rename it to `{spelled}`")


def _offload_device(draft: Draft, zero: dict[str, Any], key: str, label: str) -> Any:
    """offload_optimizer/offload_param.device. "auto" is no DeepSpeed value (OffloadDeviceEnum: none, cpu, nvme,
    deepspeed/runtime/zero/offload_config.py): accelerate's DeepSpeedPlugin fills it from its offload_*_device
    (plugin_to_config_mapping, default "none" when ACCELERATE_DEEPSPEED_OFFLOAD_*_DEVICE is unset), which is how the
    HF Trainer runs it; deepspeed.initialize alone would refuse it."""
    device = mapping_value(zero.get(key), f"{label}: zero_optimization.{key}").get("device")
    if device == "auto":
        draft.note(f"{label}: zero_optimization.{key}.device is \"auto\": filled from accelerate's "
                   f"{key}_device (default none: no offload), read as none; deepspeed.initialize without accelerate "
                   "refuses \"auto\" (its devices are none, cpu, nvme)")
        return "none"
    return device


# zero_optimization keys younger than the pydantic section: a release before them refuses the file like any unknown
# key. ZeRO++ (hpZ, qwZ, qgZ) arrived after 0.9.5 (deepspeedai/DeepSpeed issue 3827: 0.9.5 refuses them).
_ZERO_SINCE = {"zero_hpz_partition_size": "0.10.0", "zero_quantized_weights": "0.10.0",
               "zero_quantized_gradients": "0.10.0"}
# Keys of features DeepSpeed had for a while: MiCS (mics_*, from 0.9.2) and LoCo-ZeRO++ (zeropp_loco_param, from the
# 0.16 series) are fields of DeepSpeedZeroConfig up to 0.19.5 at least, and refused by name in 0.19.8
# (runtime/config.py _REMOVED_ZERO_CONFIG_KEYS: "MiCS ZeRO-3 sharding has been removed"); key -> (first, removed in),
# the removal taken as 0.19.6, the first release after the last one read that has them.
_ZERO_WHILE = {"mics_shard_size": ("0.9.2", "0.19.6"), "mics_hierarchical_params_gather": ("0.9.2", "0.19.6"),
               "zeropp_loco_param": ("0.16.5", "0.19.6")}


def _zero_keys(draft: Draft, zero: dict[str, Any], label: str) -> None:
    """zero_optimization keys DeepSpeed does not have. Unlike the top level (read key by key, the rest ignored), the
    section is a pydantic model that forbids extra keys since DeepSpeed 0.7.0 (PR #2004, runtime/config_utils.py
    DeepSpeedConfigModel extra="forbid"): deepspeed.initialize stops with "validation error for DeepSpeedZeroConfig"
    (a key from another section, such as `aio` placed inside it, is the usual case)."""
    strange = [str(k) for k in zero if (k not in keys.DEEPSPEED_ZERO and k not in _ZERO_WHILE) or (
        k in _ZERO_SINCE and not at_least(draft, "deepspeed", _ZERO_SINCE[k])) or (
        k in _ZERO_WHILE and (not at_least(draft, "deepspeed", _ZERO_WHILE[k][0]) or
                              at_least(draft, "deepspeed", _ZERO_WHILE[k][1])))]
    if not strange:
        return
    refused = at_least(draft, "deepspeed", "0.7.0")
    for key in strange:
        said, stops = f"{label}: zero_optimization.{key}", False
        if key in _ZERO_WHILE and at_least(draft, "deepspeed", _ZERO_WHILE[key][1]):
            said += (": DeepSpeed removed the feature after 0.19.5 and refuses the key by name (runtime/config.py "
                     "_REMOVED_ZERO_CONFIG_KEYS); remove it, or run a release that has it")
            stops = draft.version("deepspeed") is not None  # else a release before the removal may be the run's
        elif refused:
            said += (": DeepSpeed refuses the file (DeepSpeedZeroConfig forbids keys it lacks: \"extra fields not "
                     "permitted\"); " + ("it is a top-level section: move it out of zero_optimization"
                                          if key in keys.DEEPSPEED_TOP else "remove it"))
            # A top-level section inside it is refused by every release since 0.7.0; another key only by the
            # releases the run is known to use (keys.py lists every release's names, a key a fork added is not).
            stops = key in keys.DEEPSPEED_TOP or draft.version("deepspeed") is not None
        if stops:
            draft.stop(said)
        else:
            draft.unknown.append(said)


def apply(draft: Draft, ds: DeepSpeedConfig) -> dict[str, Any]:
    """Set engine, zero_stage, offload and (when explicit) precision; list keys DeepSpeed would not know.
    Returns {"bf16", "fp16": True/False/"auto"/None, "gather": bool, "hybrid_engine": bool}."""
    cfg, label = ds.config, ds.label
    for note in ds.notes:
        draft.note(note)
    for key in cfg:
        if key not in keys.DEEPSPEED_TOP:
            draft.unknown.append(f"{label}: {key}")
            _misspelled(draft, str(key), label)
    zero = mapping_value(cfg.get("zero_optimization"), f"{label}: zero_optimization")
    _zero_keys(draft, zero, label)
    draft.set("engine", "deepspeed", label)
    stage = zero.get("stage", 0)  # DeepSpeedZeroConfig.stage defaults to 0 (deepspeed/runtime/zero/config.py)
    where = f"{label}: zero_optimization.stage"
    if "stage" in ds.unsure:  # a fork: what the frameworks derive from the stage (zero.Init, gathers) is read per stage
        stage = draft.fork("deepspeed_stage", {n: f"the DeepSpeed config sets ZeRO stage {n}" for n in (0, 1, 2, 3)},
                           f"{label}: the file is not here and its name gives no stage")
        zero = {**zero, "stage": stage}
    draft.set("zero_stage", int_value(stage, where, "a ZeRO stage", (0, 1, 2, 3)), where if "stage" in zero else
              f"default (DeepSpeed deepspeed/runtime/zero/config.py): {label} has no zero_optimization.stage")
    bucket = zero.get("stage3_prefetch_bucket_size")
    if bucket == "auto" or (isinstance(bucket, float) and not bucket.is_integer()):
        draft.set("zero3_prefetch_bucket", "auto" if bucket == "auto" else "fraction",
                  f"{label}: zero_optimization.stage3_prefetch_bucket_size {bucket}")
    devices = [_offload_device(draft, zero, k, label) for k in ("offload_optimizer", "offload_param")]
    if any(d not in (None, "none") for d in devices) or zero.get("cpu_offload"):
        draft.set("offload", True, f"{label}: zero_optimization.offload_*.device")
    gather_key = next((k for k in ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                                   "stage3_gather_fp16_weights_on_model_save") if k in zero), None)
    gather = zero.get(gather_key) if gather_key else False  # DeepSpeed default False (runtime/zero/config.py)
    if gather == "auto":
        # HF fills nothing here; accelerate fills it from zero3_save_16bit_model (default false).
        draft.note(f"{label}: {gather_key} is \"auto\": filled from accelerate's zero3_save_16bit_model (default "
                   "false), read as false")
        gather = False
    hybrid = cfg.get("hybrid_engine") or {}
    return {"bf16": _enabled(cfg.get("bf16", cfg.get("bfloat16")), f"{label}: bf16"),
            "fp16": _enabled(cfg.get("fp16"), f"{label}: fp16"),
            "gather": as_bool(gather, f"{label}: {gather_key}") if gather_key else "gather" in ds.unsure,
            "gather_unknown": "gather" in ds.unsure, "label": label,
            "gather_key": gather_key or "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "hybrid_engine": bool(isinstance(hybrid, dict) and hybrid.get("enabled") is True), "config": cfg}


def gather_on_save(draft: Draft, info: dict[str, Any]) -> bool:
    """Whether the DeepSpeed config gathers 16-bit weights on save (for the frontends whose save goes through it).
    When its file is not here, both answers are evaluated."""
    if info.get("gather_unknown"):
        draft.maybe("adapter_save_gather", {True: "the DeepSpeed config gathers 16-bit weights on save",
                                            False: "the DeepSpeed config does not gather weights on save"},
                    f"{info.get('label')}: stage3_gather_16bit_weights_on_model_save is not visible")
    return bool(info.get("gather"))


def resolve_precision(draft: Draft, info: dict[str, Any], label: str, hf_bf16: bool | None, hf_fp16: bool | None,
                      hf_source: str, trainer: bool = True) -> None:
    """DeepSpeed bf16/fp16 sections decide; "auto" takes the HF flag (transformers fill_match). `trainer`: the HF
    Trainer hands the file to DeepSpeed (every caller but an accelerate config read alone), and refuses an explicit
    value that differs from its own flag."""
    if trainer:
        _trainer_mismatch(draft, info, label, {"bf16": hf_bf16, "fp16": hf_fp16}, hf_source)
    bf16 = hf_bf16 if info["bf16"] == "auto" else info["bf16"]
    fp16 = hf_fp16 if info["fp16"] == "auto" else info["fp16"]
    if info["bf16"] is True or info["fp16"] is True:
        key = "bf16" if info["bf16"] is True else "fp16"
        draft.set("precision", f"{key}-mixed", f"{label}: {key}.enabled (DeepSpeed keeps fp32 master weights)")
    elif bf16 or fp16:
        draft.set("precision", "bf16-mixed" if bf16 else "fp16-mixed", f"{hf_source} (fills \"auto\" in {label})")


def _trainer_mismatch(draft: Draft, info: dict[str, Any], label: str, hf: dict[str, bool | None], source: str) -> None:
    """transformers HfTrainerDeepSpeedConfig.trainer_config_process fills "auto" from --bf16/--fp16 and, for an
    explicit true/false, records a mismatch with the Trainer's own value; trainer_config_finalize then raises ("Please
    correct the following DeepSpeed config values that mismatch TrainingArguments values"). The section is looked up
    by its exact name (integrations/deepspeed.py fill_match: `bf16.enabled`, `fp16.enabled`)."""
    cfg = info.get("config") or {}
    for key, ours in hf.items():
        section = cfg.get(key)
        value = section.get("enabled") if isinstance(section, dict) else None
        if ours is None or value is None or value == "auto":
            continue
        theirs = as_bool(value, f"{label}: {key}.enabled")
        if theirs != bool(ours):
            draft.stop(f"{label}: {key}.enabled {str(theirs).lower()} while the Trainer's {key} is "
                       f"{str(bool(ours)).lower()} ({source or 'its default'}): transformers refuses the run "
                       f"(\"ds {key}.enabled={theirs} vs hf {key}|{key}_full_eval={bool(ours)}\"); set "
                       f"{key}.enabled to \"auto\" or change --{key}")


# DeepSpeed keys transformers fills from (and compares with) a TrainingArguments field of the same meaning
# (integrations/deepspeed.py trainer_config_process, since 4.7.0): field -> (DeepSpeed key, its section).
TRAINER_FIELDS = {"per_device_train_batch_size": ("train_micro_batch_size_per_gpu", None),
                  "gradient_accumulation_steps": ("gradient_accumulation_steps", None),
                  "max_grad_norm": ("gradient_clipping", None), "learning_rate": ("lr", "optimizer"),
                  "weight_decay": ("weight_decay", "optimizer")}


TRAINER_DEFAULTS = {"gradient_accumulation_steps": (1, "default (TrainingArguments: gradient_accumulation_steps 1)")}
"""What the Trainer compares a file's number with where the launch states none (a framework whose arguments are
all on the launch; a script of its own may set it in code)."""


def trainer_values(draft: Draft, info: dict[str, Any], given: dict[str, tuple[Any, str]],
                   defaults: bool = False) -> None:
    """A number the DeepSpeed file states (not "auto") that differs from the TrainingArguments value for the same
    thing: transformers refuses the run before the first step ("Please correct the following DeepSpeed config
    values that mismatch TrainingArguments values"). Values the launch states are compared, and with `defaults`
    the Trainer's own defaults for what it leaves out (TRAINER_DEFAULTS)."""
    cfg, label = info.get("config") or {}, info.get("label", "the DeepSpeed config")
    given = {**(TRAINER_DEFAULTS if defaults else {}), **given}
    for name, (key, section) in TRAINER_FIELDS.items():
        part = cfg.get(section, {}).get("params", {}) if section else cfg
        theirs = part.get(key) if isinstance(part, dict) else None
        if name not in given or theirs is None or theirs == "auto":
            continue
        ours, where = given[name]
        try:
            # transformers compares the file's value as it is: a quoted "8" is not the number 8 (LlamaFactory#1116)
            differ = isinstance(theirs, str) or float(theirs) != float(ours)
        except (TypeError, ValueError):
            continue  # a value read elsewhere (a shell variable): nothing to compare
        if differ:
            shown = f"{section}.params.{key}" if section else key
            draft.stop(f"{label}: {shown} {theirs} while {where} gives {ours}: transformers refuses the run (\"ds "
                       f"{shown}={theirs} vs hf {name}={ours}\"); set {shown} to \"auto\" or make them agree")


def _world_from_batch(draft: Draft, cfg: dict[str, Any], label: str) -> None:
    """DeepSpeed asserts train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps *
    world_size (deepspeed/runtime/config.py _batch_assertion), so a file that states all three as numbers fixes the
    number of data-parallel processes it runs on."""
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    values = [cfg.get(n) for n in names]
    if draft.has("world_size") or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return
    total, micro, accum = values
    if total % (micro * accum) == 0:
        draft.set("world_size", total // (micro * accum), f"{label}: train_batch_size {total} / "
                  f"(train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum}), which DeepSpeed "
                  "asserts equal")
    else:  # no process count satisfies the assertion: DeepSpeed stops at initialize whatever the launch
        draft.stop(f"{label}: train_batch_size {total} is no multiple of train_micro_batch_size_per_gpu "
                   f"{micro} x gradient_accumulation_steps {accum}, so DeepSpeed's batch assertion "
                   "(runtime/config.py _batch_assertion) fails on every number of processes; set one to "
                   "\"auto\" or make them agree")


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    if not paths:
        raise LoraflowError("--framework deepspeed needs the DeepSpeed config JSON: loraflow check --framework "
                            "deepspeed ds_config.json")
    for path in paths:
        info = apply(draft, read(path, "deepspeed config", draft=draft))
        label = path
        resolve_precision(draft, info, label, None, None, "")
        if "auto" in (info["bf16"], info["fp16"]):
            draft.note(f"{label}: bf16/fp16 \"auto\" is filled by the launching framework's --bf16/--fp16 flags, "
                       "not visible here; precision left at fp32")
        draft.set("adapter_save_gather", gather_on_save(draft, info), f"{label}: {info['gather_key']}" + (
            "" if info["gather"] else " (absent or false; a save through DeepSpeed writes the partitions as they are)"))
        if info["hybrid_engine"]:
            draft.set("generation_gather", True, f"{label}: hybrid_engine.enabled (gathers once per generate)")
        _world_from_batch(draft, info["config"], label)
    # What trains is the launch's choice: evaluated both ways, so a finding that needs an adapter is a question.
    draft.set("adapter", "lora", "a DeepSpeed config does not say what trains")
    draft.maybe("adapter", {"lora": "the run trains a LoRA adapter", "full": "the run fine-tunes every weight"},
                "a DeepSpeed config alone does not say whether an adapter or the whole model trains")
    draft.note("a DeepSpeed config alone does not say whether activations are checkpointed or which adapter is "
               "trained: both adapter and full fine-tuning are evaluated, checkpointing off. Check the launch command "
               "for the full picture")
    draft.flag(**FLAGS)
    finish_world(draft, None)
    return draft.result()


FRAMEWORK = Framework(name=NAME, title="DeepSpeed config", module="deepspeed", recognise=None, flags=FLAGS)
