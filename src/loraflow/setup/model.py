"""Find, inspect and load the base model and tokenizer.

`inspect_model` reads only the model's config and builds a skeleton on the meta device (no weights), so the plan
and `loraflow check` know the layer count, tied embeddings, module names and which modules the adapter targets
match, using PEFT's own matching, before anything heavy is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.losses.logprobs import logit_transform
from loraflow.locations import ASSETS, BUILTIN, location_of
from loraflow.setup.paths import quiet as _quiet
from loraflow.setup.modules import fused_weights, linear_names
from loraflow.setup.towers import Tower, find_towers, unreached_modules
from loraflow.stagespec import stage_spec

__all__ = ["ModelInfo", "inspect_model", "load_merged", "load_model", "load_tokenizer"]

@dataclass
class ModelInfo:
    path: str
    model_type: str
    num_layers: int
    tied_embeddings: bool
    use_cache_default: bool
    embedding_name: str
    lm_head_name: str | None
    norm_names: list[str] = field(default_factory=list)
    adapter_modules: list[str] = field(default_factory=list)
    """Full names of the modules the adapter config matched (empty for full fine-tuning or no match)."""
    module_names: list[str] = field(default_factory=list)
    parameters: int = 0
    vocab_size: int = 0
    linear_names: list[str] = field(default_factory=list)
    """Distinct last name parts of the linear layers (what adapter.target_modules can name), for messages."""
    attn_implementation: str = "sdpa"
    attn_reason: str = ""
    logit_transform: str | None = None
    """A transform transformers applies to the logits after the head (e.g. final_logit_softcapping=30.0)."""
    merge_notes: list[str] = field(default_factory=list)
    prequantized: str | None = None
    """How the checkpoint at model.path is already quantized (its config.json quantization_config): nf4, fp4,
    int8, or another method's name; None for float weights."""
    inspected: bool = True
    """False when `check` could not read the model's config (a hub id neither cached nor reachable)."""
    towers: dict[str, Tower] | None = None
    """An image-text model's vision encoder, projector and language model (setup/towers.py); None for a text
    model."""

    unreached: list[str] = field(default_factory=list)
    """Vision modules whose output the image-text forward never reads (setup/towers.py unreached_modules): always
    frozen."""
    tower_modules: dict[str, list[str]] = field(default_factory=dict)
    """Adapted towers -> the modules their adapter targets matched inside them (image-text models)."""
    fused_weights: dict[str, int] = field(default_factory=dict)
    """Modules that hold weights as parameters of three or more dimensions (transformers 5 stores a mixture of
    experts' expert MLPs fused, one slice per expert) -> their element count: no `target_modules` entry reaches
    them, since PEFT matches modules."""

    @property
    def image_text(self) -> bool:
        return self.towers is not None


def _module_name(model: torch.nn.Module, target: torch.nn.Module | None) -> str | None:
    for name, module in model.named_modules():
        if module is target:
            return name
    return None


def load_hf_config(config: Config):
    from transformers import AutoConfig

    path = location_of(config.model.path, "model.path")
    try:
        return path, AutoConfig.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError([f"model.path={config.model.path}: cannot read a model config there ({first}). "
                           "Point model.path at a directory with config.json, or a reachable hub id."]) from None


def load_hf_config_at(path: str, config: Config):
    """The transformers config at a resolved path (a merged temporary directory included)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)


def inspect_model(config: Config) -> ModelInfo:
    """Everything the plan needs to know about the model, without loading its weights; raises ConfigError for what
    setup would fail on (setup/preflight.py: model class, attention, merge adapters)."""
    from loraflow.setup.preflight import (
        build_skeleton,
        check_merge_adapters,
        check_model_class,
        image_text,
    )

    path, hf_config = load_hf_config(config)
    # A score head replaces the LM head; PPO's value head sits beside it, on a causal LM.
    check_model_class(config, hf_config, "score" if stage_spec(config.stage).head == "score" else "lm")
    skeleton, attn, attn_reason = build_skeleton(config, hf_config)
    merge_notes = check_merge_adapters(config, skeleton) if config.model.merge_adapters else []
    linear = linear_names(skeleton)
    embedding = skeleton.get_input_embeddings()
    head = skeleton.get_output_embeddings()
    norms = [n for n, m in skeleton.named_modules() if "norm" in type(m).__name__.lower() and n]
    towers = find_towers(skeleton) if image_text(hf_config) else None
    unreached = unreached_modules(skeleton, hf_config, towers) if towers else []
    if image_text(hf_config) and towers is None:
        raise ConfigError([f"model.path={config.model.path}: this {hf_config.model_type} model has a vision config, "
                           "but none of its modules has a vision-encoder name loraflow knows (loraflow/families.py "
                           "VISION_NAMES), so its towers cannot be told apart. Please report this architecture."])
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    info = ModelInfo(
        path=path,
        model_type=getattr(hf_config, "model_type", "unknown"),
        num_layers=int(getattr(text_config, "num_hidden_layers", 0)),
        tied_embeddings=bool(getattr(text_config, "tie_word_embeddings", False)),
        use_cache_default=bool(getattr(text_config, "use_cache", True)),
        embedding_name=_module_name(skeleton, embedding) or "embed_tokens",
        lm_head_name=_module_name(skeleton, head),
        norm_names=norms,
        module_names=[n for n, _ in skeleton.named_modules() if n],
        parameters=sum(p.numel() for p in skeleton.parameters()),
        vocab_size=int(getattr(text_config, "vocab_size", 0) or 0),
        logit_transform=logit_transform(hf_config),
        linear_names=linear, attn_implementation=attn, attn_reason=attn_reason, merge_notes=merge_notes,
        prequantized=_prequantized(hf_config), towers=towers, unreached=unreached,
        fused_weights=fused_weights(skeleton),
    )
    if config.adapter.method != "full":
        from loraflow.setup.adapters import match_adapter_modules, match_tower_modules

        if towers is None:
            info.adapter_modules = match_adapter_modules(skeleton, config)
        else:
            info.tower_modules = match_tower_modules(skeleton, config, towers, unreached)
            info.adapter_modules = sorted(n for names in info.tower_modules.values() for n in names)
    return info


def _prequantized(hf_config) -> str | None:
    """The quantization a checkpoint was saved with, in model.quantization.method's terms where bitsandbytes."""
    q = getattr(hf_config, "quantization_config", None)
    if q is None:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    if q.get("load_in_4bit"):
        return str(q.get("bnb_4bit_quant_type", "fp4"))
    if q.get("load_in_8bit"):
        return "int8"
    return str(q.get("quant_method", "unknown"))


def load_tokenizer(config: Config, model_path: str):
    from transformers import AutoTokenizer

    spec = config.model.tokenizer
    path = location_of(spec, "model.tokenizer") if spec else model_path
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError([f"cannot load a tokenizer from {path} ({_first_line(exc)}). Set model.tokenizer "
                           "to a directory or hub id that has one."]) from None
    if tok.pad_token is None:
        # Padding positions are masked out of attention and loss, so any id works; eos is the convention.
        tok.pad_token = tok.eos_token
    return tok


def _first_line(exc: BaseException) -> str:
    """The first sentence of an exception's message (transformers' import errors begin with a newline and wrap
    their sentences over lines)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    sentence = re.match(r"(.+?[.!?])(\s|$)", text)
    return (sentence.group(1) if sentence else text) or type(exc).__name__


def hf_attn_implementation(config: Config) -> str | None:
    """model.attn_implementation as transformers takes it: `auto` is its own default (None: SDPA, else eager)."""
    asked = config.model.attn_implementation
    return None if asked == "auto" else asked


def load_model(config: Config, path: str, dtype: torch.dtype, head: str = "lm", attn_implementation: str | None = None,
               quantization=None, device: str = "cpu"):
    """The base model: a causal LM, or for `head="score"` the same body with a freshly initialised scalar score
    head (transformers' *ForSequenceClassification with one label, which scores each row at its last non-pad
    token). `attn_implementation` is the plan's choice; without one, model.attn_implementation. `quantization`
    (setup/quantize.py's Quantization) loads the linear layers quantized by bitsandbytes, straight onto `device`."""
    from loraflow.setup.preflight import model_auto_class

    kwargs = dict(dtype=dtype, attn_implementation=attn_implementation or hf_attn_implementation(config),
                  trust_remote_code=config.model.trust_remote_code)
    if quantization is not None:
        # bitsandbytes quantizes as the weights load onto the device, so the full-precision copy never exists.
        kwargs.update(quantization_config=quantization.hf_config(), device_map={"": device})
    hf_config = load_hf_config_at(path, config)
    auto_class = model_auto_class(hf_config, head)
    if head == "score":
        with _quiet():  # the report that lm_head is unused and score is new is expected here
            model, info = auto_class.from_pretrained(path, num_labels=1, output_loading_info=True, **kwargs)
    else:
        model, info = auto_class.from_pretrained(path, output_loading_info=True, **kwargs)
    require_every_weight(info, path, getattr(hf_config, "transformers_version", None),
                         new=("score.",) if head == "score" else ())
    if quantization is not None:
        from loraflow.setup.quantize import keep_layout

        keep_layout(model, quantization)
    return model


def require_every_weight(info: dict, path: str, saved_by: str | None, new: tuple[str, ...] = ()) -> None:
    """Refuse a base whose checkpoint leaves weights of the model uninitialised: transformers only reports them,
    and training would start from random values where the pretrained ones were meant to be (the shipped tiny-vlm
    under transformers < 5.6 finds none of its vision encoder's 71 weights: its key names changed). `new` are the
    prefixes of heads loraflow means to start fresh (a reward model's score head)."""
    import transformers

    missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(new))
    if not missing:
        return
    shown = ", ".join(f"`{k}`" for k in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    why = ""
    if saved_by and saved_by != transformers.__version__:
        why = (f" The checkpoint was saved by transformers {saved_by} and this is {transformers.__version__}: weight "
               "names change between releases, so install a release that reads them (the one that saved it, "
               f"transformers=={saved_by}, does).")
    raise ConfigError([f"model.path={path}: {len(missing)} weights of the model are not in the checkpoint ({shown}), "
                       f"so training would start them from random values.{why} Otherwise point model.path at a "
                       "checkpoint of this architecture."])


def load_merged(config: Config, path: str, dtype: torch.dtype, head: str, attn_implementation: str | None,
                quantization, device: str, merges: list[str]) -> torch.nn.Module:
    """The base with earlier adapters (model.merge_adapters) folded in. A quantized base is merged in `dtype`
    first and then quantized as it loads, as a merged checkpoint would be (merging into 4-bit weights would round
    the adapters' update away); the merged weights pass through a temporary directory, removed once loaded."""
    if quantization is None or not merges:
        model = load_model(config, path, dtype, head, attn_implementation, quantization, device)
        return merge_adapters(model, merges)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="loraflow-merged-") as tmp:
        full = load_model(config, path, dtype, head, attn_implementation)
        merge_adapters(full, merges).save_pretrained(tmp, safe_serialization=True)
        del full
        model = load_model(config, tmp, dtype, head, attn_implementation, quantization, device)
    # An adapter records its base (adapter_config.json): `path`, not the directory just removed.
    model.name_or_path = model.config._name_or_path = path
    return model


def merge_adapters(model: torch.nn.Module, specs: list[str]) -> torch.nn.Module:
    """Fold each PEFT adapter (model.merge_adapters) into the base weights, in order."""
    from peft import PeftConfig, PeftModel

    for spec in specs:
        path = location_of(spec, "model.merge_adapters")
        if not (Path(path) / "adapter_config.json").is_file():
            raise ConfigError([f"model.merge_adapters: {spec} holds no adapter_config.json; give the `adapter` "
                               "directory of an earlier run."])
        config = PeftConfig.from_pretrained(path)
        # The adapter's task type names the head it was trained with (CAUSAL_LM for SFT). The weights folded in
        # are the body's, so a reward model (a sequence-classification head) can start from an SFT model, as
        # InstructGPT's does; the task-specific PeftModel subclass would expect the SFT model's generate().
        config.task_type = None
        with _quiet():
            model = PeftModel.from_pretrained(model, path, config=config).merge_and_unload()
    return model
