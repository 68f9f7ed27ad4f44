"""Sparse mixture-of-experts blocks under ZeRO-3 (rule moe-zero3-expert-hang): which transformers releases run only
the experts a micro-batch's tokens reach, and which frameworks register the block as a ZeRO-3 leaf module so it is
gathered whole. Data and pure functions only (common.model_name_facts passes its version test in), so frontends of
every framework read them alike."""

from __future__ import annotations

from typing import Callable

MOE_SKIPS: dict[str, tuple[tuple[str | None, str], ...]] = {
    # model type -> transformers ranges [from, until) whose block holds one nn.Module per expert and calls only the
    # experts with tokens (`if top_x.shape[0] == 0: continue`, a loop over expert_hit, `if token_indices.numel() >
    # 0`), read from each minor release's wheel (4.36.0 - 4.57.0). 5.0.0 stacks the experts into one module of 3-D
    # parameters (MixtralExperts.gate_up_proj ...), gathered whole on every call.
    "mixtral": ((None, "4.40.0"), ("4.52.0", "5.0.0")),  # 4.40 - 4.51 ran every expert
    "qwen2_moe": (("4.52.0", "5.0.0"),),
    "qwen3_moe": (("4.53.0", "5.0.0"),),  # 4.51 - 4.52 ran every expert (ms-swift#5875: pin 4.51.3)
    "qwen3_next": ((None, "5.0.0"),), "qwen3_omni_moe": ((None, "5.0.0"),), "qwen3_vl_moe": ((None, "5.0.0"),),
    "phimoe": ((None, "5.0.0"),), "jamba": ((None, "5.0.0"),),
    "deepseek_v2": ((None, "5.0.0"),), "deepseek_v3": ((None, "5.0.0"),), "glm4_moe": ((None, "5.0.0"),),
}

LEAVES: dict[str, tuple[dict[str, str | None], str]] = {
    # framework -> ({model type: its first release that registers the block, None for every release read}, where)
    # Mixtral's from PR #2283 (January 2024, v0.5.0; hiyouga/LLaMA-Factory#1931 and #2315 hung before it).
    "llama-factory": ({**dict.fromkeys(("dbrx", "deepseek_v2", "deepseek_v3", "granitemoe", "glm4_moe", "jamba",
                                        "jetmoe", "llama4", "olmoe", "phimoe", "qwen2_moe", "qwen3_moe")),
                       "mixtral": "0.5.0"}, "src/llamafactory/model/model_utils/moe.py add_z3_leaf_module"),
    "ms-swift": (dict.fromkeys(("qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "qwen3_omni_moe", "qwen3_next", "glm4_moe",
                                "llama4"), "3.9.0"), "swift/llm/model/register.py deepspeed_set_z3_leaf_modules"),
    "axolotl": ({**dict.fromkeys(("dbrx", "jamba", "jetmoe", "mixtral", "qwen2_moe", "deepseek_v2")),
                 "qwen3_moe": "0.10.0"}, "src/axolotl/utils/models.py set_z3_leaf_modules (MOE_ARCH_BLOCK)"),
    # Every class named *SparseMoeBlock (openrlhf/models/actor.py, from 0.8.10; absent in 0.8.9).
    "openrlhf": (dict.fromkeys(("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "qwen3_vl_moe",
                                "phimoe", "jamba"), "0.8.10"), "openrlhf/models/actor.py set_z3_leaf_modules"),
}


def moe_facts(draft, kind: str | None, model: str, source: str, at_least: Callable) -> None:
    """moe_skips_experts and moe_leaf_registered for a model of type `kind`; `at_least(draft, package, version)`
    is the frontends' version test (common.at_least), which records the releases it compares with."""
    ranges = MOE_SKIPS.get(kind or "")
    if not ranges:
        return
    skips = any((lo is None or at_least(draft, "transformers", lo)) and not at_least(draft, "transformers", hi)
                for lo, hi in ranges)
    spans = ", ".join(f"{lo or ''}-{hi}" for lo, hi in ranges)
    draft.set("moe_skips_experts", skips, f"{source} ({model}: {kind}'s block " + (
        "calls only the experts its tokens reach" if skips else "runs every expert") +
        f" in this transformers; it skips them in {spans})")
    table, where = LEAVES.get(draft.framework, ({}, ""))
    if kind in table:
        since = table[kind]
        done = since is None or at_least(draft, draft.framework, since)
        draft.set("moe_leaf_registered", done, f"{where}" + (f" (from {draft.framework} {since})" if since else "")
                  if done else f"{draft.framework} < {since} registers no ZeRO-3 leaf module ({where} from {since})")
    elif not draft.has("moe_leaf_registered"):
        draft.set("moe_leaf_registered", False, f"no ZeRO-3 leaf module is registered for {kind} ("
                  + (f"{where} lists none for it" if where else "transformers' integration registers none") + ")")
