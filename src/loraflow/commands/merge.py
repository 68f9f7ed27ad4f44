"""`loraflow merge`: fold a saved adapter into its base weights and write a plain transformers model.

The base is found as `loraflow generate` finds it (generate.load): from the run's config when the adapter belongs
to a run (so the adapters that run merged into its base, model.merge_adapters, are merged here too), else from
adapter_config.json, or from --base. An image-text model is written with its processor (tokenizer, image processor,
chat template), so AutoProcessor loads the merged directory as it loads the run's adapter.

A QLoRA adapter was trained on quantized weights, and merging into 4-bit weights would round its update away. The
base is dequantized into `dtype` (the weights the adapter saw, as floats) and the adapter merged there. The merged
model's outputs are compared with the adapter on that dequantized base (the merge itself: equal up to float rounding)
and with the adapter on the quantized base (what was trained: differs by the compute dtype's rounding), and both
figures are printed and written beside the model (merge_report.json). The base on disk is only read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from loraflow.errors import ConfigError

DTYPES = ("float32", "bfloat16")
"""What a quantized base may be dequantized into (torch dtype names)."""


@dataclass
class MergeReport:
    output: Path
    dequantized_to: str | None = None
    """The dtype a quantized base was dequantized into (None: the base was not quantized)."""
    vs_dequantized: float | None = None
    """Largest |logit difference| of the merged model against the adapter on the dequantized base."""
    vs_quantized: float | None = None
    """... against the adapter on the quantized base the run trained."""

    def render(self) -> str:
        lines = [f"merged model written to {self.output}"]
        if self.dequantized_to:
            lines.append(f"the base was quantized: dequantized to {self.dequantized_to} and merged there; largest "
                         f"|logit difference| on a probe batch: {self.vs_dequantized:.3g} against the adapter on the "
                         f"dequantized base, {self.vs_quantized:.3g} against the adapter on the quantized base "
                         "(the trained model; the gap is the compute's rounding)")
        return "\n".join(lines)


def merge(adapter_dir: str, output_dir: str, base: str | None = None, dtype: str = "float32") -> MergeReport:
    from peft import PeftModel

    from loraflow.commands.generate import load
    from loraflow.setup.quantize import quantized_linears

    adapter = Path(adapter_dir)
    if (adapter / "config.json").is_file() and not (adapter / "adapter_config.json").is_file():
        raise ConfigError([f"{adapter} holds a whole model, not an adapter: there is nothing to merge. Pass the "
                           "adapter directory of a run (RUN/adapter or a checkpoint)."])
    if dtype not in DTYPES:
        raise ConfigError([f"--dtype {dtype}: choose one of {', '.join(DTYPES)}."])
    loaded = load(adapter_dir, base)
    if not isinstance(loaded.model, PeftModel):
        raise ConfigError([f"{adapter} holds no adapter (adapter_config.json); pass the adapter directory of a run "
                           "(RUN/adapter or a checkpoint)."])
    out = Path(output_dir)
    report = MergeReport(out)
    if quantized_linears(loaded.model):
        merged = _merge_dequantized(loaded, getattr(torch, dtype), report)
    else:
        merged = loaded.model.merge_and_unload().to("cpu")
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    # An image-text model is unusable without its processor (image processor, tokenizer, chat template):
    # AutoProcessor.from_pretrained(out) must load, as it loads the run's adapter folder.
    (loaded.processor or loaded.tokenizer).save_pretrained(out)
    if report.dequantized_to:
        (out / "merge_report.json").write_text(json.dumps({k: v for k, v in vars(report).items() if k != "output"},
                                                          indent=2) + "\n")
    return report


def _merge_dequantized(loaded, dtype: torch.dtype, report: MergeReport):
    """Dequantize the base under the adapter, merge there, and measure the merged model against both bases."""
    from peft import PeftModel

    from loraflow.setup.paths import quiet
    from loraflow.setup.quantize import dequantize_model

    model = loaded.model
    probe = _probe_batch(model, loaded.device)
    quantized_logits = _logits(model, probe)
    base = dequantize_model(model.unload(), dtype)  # unload: the base without the adapter's layers
    with quiet():
        on_dequantized = PeftModel.from_pretrained(base, str(loaded.adapter)).eval()
    dequantized_logits = _logits(on_dequantized, probe)
    merged = on_dequantized.merge_and_unload().eval()
    merged_logits = _logits(merged, probe)
    report.dequantized_to = str(dtype).replace("torch.", "")
    report.vs_dequantized = (merged_logits - dequantized_logits).abs().max().item()
    report.vs_quantized = (merged_logits - quantized_logits).abs().max().item()
    return merged.to("cpu")


def _probe_batch(model, device: str) -> torch.Tensor:
    """Fixed token ids over the model's vocabulary (seeded, so the figures repeat)."""
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (2, 32), generator=generator).to(device)


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits.float()
