"""A context that keeps transformers and PEFT quiet while loraflow builds throwaway models. (Where a config's
model, tokenizer, data file or adapter lives is loraflow.locations, below data/ and setup/.)"""

from __future__ import annotations

import contextlib
import io
import logging

__all__ = ["quiet"]


@contextlib.contextmanager
def quiet():
    """Silence transformers/PEFT chatter while building throwaway skeletons."""
    loggers = [logging.getLogger(n) for n in ("transformers", "peft")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
