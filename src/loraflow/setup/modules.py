"""What a model's module tree says about its weights, read the same way by the plan's inspection (setup/model.py,
on a meta skeleton) and by the adapters (setup/adapters.py, on the loaded model)."""

from __future__ import annotations

import torch


def fused_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Full names of the parameters of three or more dimensions outside convolutions (a convolution's kernel has
    four or five and is an ordinary layer) -> their element count: a mixture of experts' fused expert weights."""
    from torch.nn.modules.conv import _ConvNd

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, _ConvNd):
            continue
        for param_name, p in module.named_parameters(recurse=False):
            if p.dim() >= 3:
                out[f"{name}.{param_name}" if name else param_name] = p.numel()
    return out


def fused_weights(model: torch.nn.Module) -> dict[str, int]:
    """ModelInfo.fused_weights: the modules holding fused_parameters -> their element count."""
    out: dict[str, int] = {}
    for name, size in fused_parameters(model).items():
        module = name.rpartition(".")[0]
        out[module] = out.get(module, 0) + size
    return out


def linear_names(model: torch.nn.Module) -> list[str]:
    """ModelInfo.linear_names: distinct last name parts of the linear layers but the output head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if n and type(m).__name__ in ("Linear", "Conv1D") and m is not head})
