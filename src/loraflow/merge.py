"""`loraflow merge`: fold a saved adapter into its base weights and write a plain transformers model."""

from __future__ import annotations

import json
from pathlib import Path

from loraflow.errors import ConfigError
from loraflow.setup.model import resolve_path


def merge(adapter_dir: str, output_dir: str, base: str | None = None) -> Path:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter_dir)
    cfg_path = adapter / "adapter_config.json"
    if not cfg_path.is_file():
        raise ConfigError([f"{adapter} has no adapter_config.json; pass the adapter directory of a run "
                           "(run_dir/adapter or a checkpoint)."])
    base = base or json.loads(cfg_path.read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError([f"{cfg_path} does not record its base model; pass --base."])
    base_path = resolve_path(base, "--base")
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    tok_source = adapter if (adapter / "tokenizer_config.json").is_file() else Path(base_path)
    AutoTokenizer.from_pretrained(tok_source).save_pretrained(out)
    return out
