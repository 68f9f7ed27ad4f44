"""`loraflow probe`: tiny live reproductions of the registry's rules on the installed stack.

Each Case names a rule, the naive Combination that triggers it, and an `execute(setup, ctx)` function that runs one
training step (or save, or generate) of a tiny model exactly as the Combination says, on 1 or 2 ranks. The runner
executes every case in its own subprocess twice: once with the naive Combination (does this stack break?) and once with
the Combination loraflow's plan turns it into (`rules.evaluate`); a plan that refuses the setup counts as safe.
The registry also predicts the naive outcome from the installed versions; the table shows both, so a stack that
behaves differently from the catalog is visible at once.
"""

from __future__ import annotations

# The types and the registry live in base.py so case modules can use them without importing this package (which
# imports them to register their cases); re-exported here for callers outside the package.
from loraflow.probes.base import _CASES, Case, Context, Observation, Status, case  # noqa: F401


def all_cases() -> dict[str, Case]:
    from loraflow.probes import (
        cases,  # noqa: F401  (single-process reproductions register on import)
        distributed,  # noqa: F401  (DDP, DeepSpeed and FSDP reproductions)
        placement,  # noqa: F401  (where a model is placed as it loads)
        precision,  # noqa: F401  (number formats: fp16 overflow, adapter dtypes)
        quantized,  # noqa: F401  (bitsandbytes 4-bit bases)
        rollout,  # noqa: F401  (rollouts on vLLM servers; last: the runner starts their servers meanwhile)
        vision,  # noqa: F401  (image-text models)
    )

    return dict(_CASES)
