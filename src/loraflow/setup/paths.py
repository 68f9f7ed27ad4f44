"""A context that keeps transformers and PEFT quiet while loraflow builds throwaway models.

Where a config names a model, tokenizer, data file or adapter is found by loraflow.locations (below data/ and
setup/, which both read it); its names are re-exported here for the modules that still import them from this
place (`resolve_path` is the old name of `location_of`)."""

from __future__ import annotations

import contextlib
import io
import logging

from loraflow.locations import ASSETS, BUILTIN, location_of

resolve_path = location_of  # the old name, for setup/model, inputs, processor, preflight, reward_model, generate,
# engines/deepspeed_config and scripts/compatibility_matrix until they import location_of from loraflow.locations

__all__ = ["ASSETS", "BUILTIN", "location_of", "quiet", "resolve_path"]


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
