"""`loraflow merge`: fold a saved adapter into its base weights and write a plain transformers model.

The base is found as `loraflow generate` finds it (generate.load): from the run's config when the adapter belongs
to a run (so the adapters that run merged into its base, model.merge_adapters, are merged here too), else from
adapter_config.json, or from --base.
"""

from __future__ import annotations

from pathlib import Path

from loraflow.errors import ConfigError


def merge(adapter_dir: str, output_dir: str, base: str | None = None) -> Path:
    from peft import PeftModel

    from loraflow.generate import load

    adapter = Path(adapter_dir)
    if (adapter / "config.json").is_file() and not (adapter / "adapter_config.json").is_file():
        raise ConfigError([f"{adapter} holds a whole model, not an adapter: there is nothing to merge. Pass the "
                           "adapter directory of a run (RUN/adapter or a checkpoint)."])
    loaded = load(adapter_dir, base)
    if not isinstance(loaded.model, PeftModel):
        raise ConfigError([f"{adapter} holds no adapter (adapter_config.json); pass the adapter directory of a run "
                           "(RUN/adapter or a checkpoint)."])
    merged = loaded.model.merge_and_unload().to("cpu")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    loaded.tokenizer.save_pretrained(out)
    return out
