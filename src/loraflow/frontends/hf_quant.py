"""The 4-bit storage dtype of an HF Trainer / TRL launch (`--bnb_4bit_quant_storage`, or the script's own storage
flag): whether FSDP / ZeRO-3 find the packed 4-bit weights in the model's dtype."""

from __future__ import annotations

from loraflow.frontends.common import Draft
from loraflow.frontends.hf_options import Opt, Run
from loraflow.frontends.kbit_facts import storage_honoured


def quant_storage(draft: Draft, run: Run, bf16: bool, fp16: bool) -> None:
    if draft.get("quantization") != "4bit":
        return
    opts = run.opts
    storage = (str(opts["bnb_4bit_quant_storage"].value) if "bnb_4bit_quant_storage" in opts else
               run.intent.storage)
    dtype = str((opts.get("dtype") or opts.get("torch_dtype") or Opt("", "")).value)
    same = storage is not None and storage in (dtype, "bfloat16" if bf16 else "float16" if fp16 else "float32")
    where = ((opts["bnb_4bit_quant_storage"].source if "bnb_4bit_quant_storage" in opts else
              f"{storage} (the script's storage flag)") if storage else
             "default (bnb_4bit_quant_storage unset: packed uint8, trl/trainer/utils.py)" if run.trl else
             "default (BitsAndBytesConfig bnb_4bit_quant_storage unset: packed uint8)")
    if same and not storage_honoured(draft):
        # The flag only reaches the weights from transformers 4.39 / bitsandbytes 0.43 (kbit_facts): before them
        # the 4-bit weights stay packed uint8 whatever was asked (huggingface/peft#1923 ran bitsandbytes 0.41.1).
        same, where = False, f"{where}, unused before transformers 4.39 / bitsandbytes 0.43 (weights stay uint8)"
    draft.set("quant_storage_matches", same, where)
    if storage is None and "load_in_4bit" not in opts and run.intent.quantization:
        # The 4-bit load is the script's own (`--bits 4`): its BitsAndBytesConfig, not TRL's, decides the storage;
        # transformers' default is uint8 (BitsAndBytesConfig bnb_4bit_quant_storage=None, quantization_config.py).
        draft.maybe("quant_storage_matches", {False: "the script's BitsAndBytesConfig leaves bnb_4bit_quant_storage "
                                                     "unset (packed uint8)",
                                              True: "the script sets bnb_4bit_quant_storage to the model's dtype"},
                    f"{run.intent.sources['quantization']}: the script builds its own BitsAndBytesConfig")
