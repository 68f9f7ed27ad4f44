"""Sparse mixture-of-experts blocks under ZeRO-3 (rule moe-zero3-expert-hang): which transformers releases run only
the experts a micro-batch's tokens reach, and which frameworks register the block as a ZeRO-3 leaf module so it is
gathered whole. Data and pure functions only (model_types.model_name_facts passes its version test in), so
frontends of every framework read them alike."""

from __future__ import annotations

from typing import Callable

from loraflow.frontends.base import Mitigation

MOE_SKIPS: dict[str, tuple[tuple[str | None, str], ...]] = {
    # model type -> transformers ranges [from, until) whose block holds one nn.Module per expert and calls only the
    # experts with tokens (`if top_x.shape[0] == 0: continue`, a loop over expert_hit, `if token_indices.numel() >
    # 0`), read from each minor release's wheel (4.36.0 - 4.57.0). 5.0.0 stacks the experts into one module of 3-D
    # parameters (MixtralExperts.gate_up_proj ...), gathered whole on every call.
    "mixtral": ((None, "4.40.0"), ("4.52.0", "5.0.0")),  # 4.40 - 4.51 ran every expert
    "qwen2_moe": (("4.52.0", "5.0.0"),),
    "qwen3_moe": (("4.53.0", "5.0.0"),),  # 4.51 - 4.52 ran every expert (ms-swift#5875: pin 4.51.3)
    "qwen3_next": ((None, "5.0.0"),), "qwen3_omni_moe": ((None, "5.0.0"),),  # (Qwen3-VL-MoE stacks its experts)
    "phimoe": ((None, "5.0.0"),), "jamba": ((None, "5.0.0"),),
    "deepseek_v2": ((None, "5.0.0"),), "deepseek_v3": ((None, "5.0.0"),), "glm4_moe": ((None, "5.0.0"),),
}

RULE = "moe-zero3-expert-hang"


def _leaves(since: str, blocks: str, source: str) -> Mitigation:
    return Mitigation((RULE,), since, f"registers the MoE blocks of {blocks} as ZeRO-3 leaf modules "
                      "(deepspeed.utils.set_z3_leaf_modules), gathered whole whatever the routing", source)


LEAVES: dict[str, tuple[tuple[frozenset[str], Mitigation], ...]] = {
    # framework -> (model types, the release that registers their blocks and where) for each group. Each
    # Mitigation is declared on its framework too (docs/mitigations.md); the types it covers are listed here.
    # LLaMA-Factory: Mixtral's from PR #2283 (January 2024, v0.5.0; hiyouga/LLaMA-Factory#1931 and #2315 hung
    # before it), the others as each model type arrived.
    "llama-factory": ((frozenset({"dbrx", "deepseek_v2", "deepseek_v3", "granitemoe", "glm4_moe", "jamba", "jetmoe",
                                  "llama4", "mixtral", "olmoe", "phimoe", "qwen2_moe", "qwen3_moe"}),
                       _leaves("0.5.0", "the MoE models it supports", "src/llamafactory/model/model_utils/moe.py "
                               "add_z3_leaf_module")),),
    "ms-swift": ((frozenset({"qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "qwen3_omni_moe", "qwen3_next", "glm4_moe",
                             "llama4"}),
                  _leaves("3.9.0", "Qwen2/3-MoE, Qwen3-Omni, Qwen3-Next, GLM-4.5 and Llama 4 (not Mixtral, not "
                          "DeepSeek)", "swift/llm/model/register.py deepspeed_set_z3_leaf_modules")),),
    "axolotl": ((frozenset({"dbrx", "jamba", "jetmoe", "mixtral", "qwen2_moe", "deepseek_v2"}),
                 _leaves("0.5.0", "DBRX, Jamba, JetMoE, Mixtral, Qwen2-MoE and DeepSeek-V2",
                         "src/axolotl/utils/models.py set_z3_leaf_modules (MOE_ARCH_BLOCK)")),
                (frozenset({"qwen3_moe"}), _leaves("0.10.0", "Qwen3-MoE", "MOE_ARCH_BLOCK qwen3_moe (absent in "
                                                   "0.9.0)"))),
    # Every class named *SparseMoeBlock (absent in 0.8.9).
    "openrlhf": ((frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "phimoe",
                             "jamba"}),
                  _leaves("0.8.10", "every *SparseMoeBlock class", "openrlhf/models/actor.py set_z3_leaf_modules")),),
}


def mitigations(framework: str) -> tuple[Mitigation, ...]:
    """The leaf registrations a framework declares (Framework.mitigations)."""
    return tuple(m for _, m in LEAVES.get(framework, ()))


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
    groups = LEAVES.get(draft.framework, ())
    found = next((m for types, m in groups if kind in types), None)
    if found is not None:
        done = at_least(draft, draft.framework, found.since)
        draft.set("moe_leaf_registered", done, f"{found.source} (from {draft.framework} {found.since})" if done else
                  f"{draft.framework} < {found.since} registers no ZeRO-3 leaf module ({found.source})")
    elif not draft.has("moe_leaf_registered"):
        draft.set("moe_leaf_registered", False, f"no ZeRO-3 leaf module is registered for {kind} (" + (
            f"{draft.framework} registers none for it" if groups else "transformers' integration registers none")
            + ")")
