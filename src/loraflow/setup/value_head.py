"""PPO's critic: a value head on the policy's own body (the layout of TRL's classic
AutoModelForCausalLMWithValueHead), trained in full beside the adapters.

The head reads the final hidden states where the output head reads them: a forward pre-hook on the output
embedding runs it inside the model's own forward. That keeps it inside whatever the engine wraps (DDP's reducer,
ZeRO-3's parameter gathering, FSDP2's root unit) with no second forward and no change to the model's outputs; the
stage reads the values the last forward left in `ValueHead.values`. It is attached after PEFT wraps the model, so
the adapter PEFT saves stays loadable on the plain base; the head is saved beside it
(checkpoint.EXTRA_WEIGHTS).
"""

from __future__ import annotations

import torch


class ValueHead(torch.nn.Module):
    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        # Zero start: the first advantages are the returns themselves, whatever the hidden states' scale.
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.values: torch.Tensor | None = None
        """[B, T] values of the last forward (float32)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden).squeeze(-1).float()

    def capture(self, module: torch.nn.Module, args: tuple) -> None:
        self.values = self(args[0])


def attach_value_head(model: torch.nn.Module, dtype: torch.dtype) -> ValueHead:
    """Register a ValueHead on the transformers model inside `model` (a PeftModel or the model itself) as
    `v_head`, trainable, reading the output head's input."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = ValueHead(inner.config.get_text_config().hidden_size, dtype)
    inner.v_head = head
    inner.get_output_embeddings().register_forward_pre_hook(head.capture)
    return head


def find_value_head(model: torch.nn.Module) -> ValueHead:
    for module in model.modules():
        if isinstance(module, ValueHead):
            return module
    raise LookupError("the model has no value head; stage ppo attaches one in build_model")
