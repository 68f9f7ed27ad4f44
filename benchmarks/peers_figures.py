"""The model shapes of benchmarks/peers.py and the figures computed from them rather than measured: the useful-work
floor of a step, MFU's numerator, and the matmul rate both are divided by."""

from __future__ import annotations

import statistics
import time

SMOKE_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 172,
               "vocab_size": 1000}
DEFAULT_MODEL = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 1376,
                 "vocab_size": 32000}
LLAMA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0}
"""meta-llama/Llama-3.2-1B's config.json (1.24B parameters with the embedding), built from these values with random
weights: nothing is downloaded."""

NOMINAL_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1}
"""Dense bf16 tensor-core peaks from NVIDIA's datasheets, matched in this order against the device name (the PCIe
H100 before the SXM one). MFU is reported against this peak where the device is listed, and against the bf16
matmul rate measured in the same run in every case."""


def kv_width(shape: dict) -> int:
    """Width of the key and value projections: grouped-query attention shares each key/value head between
    num_attention_heads / num_key_value_heads query heads."""
    heads = shape["num_attention_heads"]
    return shape["hidden_size"] * shape.get("num_key_value_heads", heads) // heads


def decoder_linears(shape: dict) -> tuple[int, list[tuple[int, int]]]:
    """Weights of one decoder layer's linear layers and their (in, out) widths: q, k, v, o, gate, up, down."""
    h, m, kv = shape["hidden_size"], shape["intermediate_size"], kv_width(shape)
    dims = [(h, h), (h, kv), (h, kv), (h, h), (h, m), (h, m), (m, h)]
    return sum(i * o for i, o in dims), dims


def useful_flops(shape: dict, seq: int, batch: int, rank: int = 16) -> dict[str, float]:
    """What a step must compute at least (the module docstring of peers.py), term by term."""
    h, layers, v = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    weights, dims = decoder_linears(shape)
    tokens = seq * batch
    learned = (seq - seq // 2) * batch  # completion tokens predicted from the position before each
    lora = layers * rank * sum(i + o for i, o in dims)  # r (in + out) per adapted linear
    terms = {"frozen_linears": 4 * layers * weights * tokens, "lora": 6 * lora * tokens,
             "attention": 3 * (2 * 2 * seq * seq * h / 2) * layers * batch, "head": 4 * h * v * learned}
    terms["total"] = sum(terms.values())
    return terms


def model_flops(shape: dict, seq: int, batch: int, recompute: bool) -> float:
    """MFU's numerator per step, the same for every variant: 4 N per token for a frozen base (forward and input
    gradient; a frozen weight gets no weight gradient), 6 N with full recompute (one more forward), N the
    non-embedding weights with the head; plus causal attention, 2 s^2 h per layer and sequence forward, twice
    that backward, once more when recomputed."""
    h, layers, v = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    n = layers * decoder_linears(shape)[0] + h * v
    forwards = 4 if recompute else 3  # forward, backward (= 2 forwards), and the recompute's forward
    attention = forwards * 2 * seq * seq * h * layers * batch
    return (6 if recompute else 4) * n * seq * batch + attention


def nominal_peak(device_name: str) -> float | None:
    """The datasheet bf16 peak (FLOP/s) of a device whose name holds a key of NOMINAL_BF16_TFLOPS, else None."""
    for key, tflops in NOMINAL_BF16_TFLOPS.items():
        if key in device_name:
            return tflops * 1e12
    return None


def matmul_rate(device: str, dtype_name: str = "float32", size: int | None = None, repeats: int = 7) -> float:
    """FLOP/s of size^3 matmuls in `dtype_name`: the median of `repeats` after one warm-up. The default size is
    2048 on the CPU and 8192 on CUDA (a 2048 product is too short to fill an H100)."""
    import torch

    dtype = getattr(torch, dtype_name)
    size = size or (8192 if device == "cuda" else 2048)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = []
    for i in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(times)
