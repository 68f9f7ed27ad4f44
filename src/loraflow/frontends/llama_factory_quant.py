"""LLaMA-Factory's on-the-fly quantization: `quantization_bit` with `quantization_method`, and the storage dtype of
the 4-bit weights (model/model_utils/quantization.py).

The method's spelling changed: hparams/model_args.py had `quantization_method: Literal["bitsandbytes", "hqq", "eetq"]`
(default "bitsandbytes", the 0.8 and early 0.9 releases and the docs at llamafactory.readthedocs.io); later releases
type it as extras/constants.py QuantizationMethod, whose BNB is "bnb". Users' configs carry both spellings, and both
name bitsandbytes, so both quantize the base (hqq and eetq are other libraries with no rule here)."""

from __future__ import annotations

from loraflow.frontends.common import Draft, accessors, int_value, mitigated
from loraflow.frontends.kbit_facts import storage_honoured

BITSANDBYTES = ("bnb", "bitsandbytes")


def apply(draft: Draft, opts: dict) -> None:
    """quantization (4bit / 8bit) and whether the 4-bit storage dtype matches the dtype an engine shards."""
    get, src, on = accessors(opts)
    bits = get("quantization_bit")
    method = str(get("quantization_method", "bnb")).lower()
    if bits in (None, "null", "None") or method not in BITSANDBYTES:
        return
    bits = int_value(bits, src("quantization_bit"), "a number of bits")
    where = src("quantization_bit") + (f" ({src('quantization_method')})" if "quantization_method" in opts else "")
    draft.set("quantization", "4bit" if bits == 4 else "8bit", where)
    if method == "bitsandbytes":
        draft.note(f"{src('quantization_method')}: the spelling of the releases whose quantization_method is "
                   "Literal['bitsandbytes', 'hqq', 'eetq']; later ones name it `bnb` and refuse `bitsandbytes`")
    if not mitigated(draft, "qlora-storage-dtype"):
        draft.set("quant_storage_matches", False, "LLaMA-Factory < 0.6.0 passes no bnb_4bit_quant_storage "
                  "(src/llmtuner/model/patcher.py _configure_quantization)")
    elif storage_honoured(draft):
        draft.set("quant_storage_matches", True, "LLaMA-Factory sets bnb_4bit_quant_storage to the compute dtype "
                  "(model_utils/quantization.py)")
    else:
        draft.set("quant_storage_matches", False, "LLaMA-Factory passes bnb_4bit_quant_storage, which transformers "
                  "< 4.39 / bitsandbytes < 0.43 leave unused (weights stay uint8)")
