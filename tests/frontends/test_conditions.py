"""How `check` words the condition under which a finding holds (frontends/scenarios.describe): over the fewest
unknowns that decide it, each unknown's values said once where the holding combinations are all of them."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends.scenarios import FLOOR, Variable, describe


def _vars():
    lf = Variable("llama-factory", "version", points=[Version("0.5.0"), Version("0.6.0")])
    engine = Variable("engine", "choice", values=["ddp", "zero3", "fsdp1"],
                      labels={"ddp": "it selects DDP", "zero3": "it selects ZeRO-3", "fsdp1": "it selects FSDP"})
    return lf, engine


def test_a_release_range_times_several_choices_is_one_conjunction():
    lf, engine = _vars()
    scenarios = [{"llama-factory": v, "engine": e} for v in lf.domain() for e in engine.values]
    holds = [s["llama-factory"] < Version("0.6.0") and s["engine"] != "ddp" for s in scenarios]
    said, by = describe(holds, scenarios, [lf, engine])
    assert said == "llama-factory<0.6.0 and (it selects ZeRO-3 or it selects FSDP)"
    assert set(by) == {"llama-factory", "engine"}


def test_combinations_that_are_not_a_product_stay_alternatives():
    lf, engine = _vars()
    scenarios = [{"llama-factory": v, "engine": e} for v in lf.domain() for e in engine.values]
    holds = [(s["llama-factory"] == FLOOR and s["engine"] == "zero3") or
             (s["llama-factory"] != FLOOR and s["engine"] == "fsdp1") for s in scenarios]
    said, _ = describe(holds, scenarios, [lf, engine])
    assert " or " in said and said.count("(") >= 2, said


def test_one_choice_alone_lists_its_values():
    _, engine = _vars()
    scenarios = [{"engine": e} for e in engine.values]
    said, _ = describe([e != "ddp" for e in engine.values], scenarios, [engine])
    assert said == "it selects ZeRO-3 or it selects FSDP"


def test_alternatives_over_several_releases_are_covered_and_what_they_share_said_once():
    transformers = Variable("transformers", "version", points=[Version("4.39.0"), Version("4.47.0")])
    bnb = Variable("bitsandbytes", "version", points=[Version("0.43.0")])
    stage = Variable("stage", "choice", values=[2, 3], labels={2: "ZeRO-2", 3: "ZeRO-3"})
    scenarios = [{"transformers": t, "bitsandbytes": b, "stage": s}
                 for t in transformers.domain() for b in bnb.domain() for s in stage.values]
    holds = [s["stage"] == 3 and (s["transformers"] == FLOOR or s["bitsandbytes"] == FLOOR) for s in scenarios]
    said, by = describe(holds, scenarios, [transformers, bnb, stage])
    # One alternative per deciding release range (not one per interval of the others), the shared stage said once.
    assert said == "ZeRO-3 and (bitsandbytes<0.43.0 or transformers<4.39.0)", said
    assert set(by) == {"transformers", "bitsandbytes", "stage"}


def test_the_unknown_that_decides_is_found_among_many():
    variables = [Variable(f"pkg{i}", "version", points=[Version("1.0"), Version("2.0")]) for i in range(9)]
    scenarios = [dict(zip((v.name for v in variables), values))
                 for values in __import__("itertools").product(*(v.domain() for v in variables))]
    holds = [s["pkg8"] == FLOOR for s in scenarios]  # 3^9 = 19683 scenarios, decided by the last unknown alone
    assert describe(holds, scenarios, variables) == ("pkg8<1.0", ("pkg8",))


def test_every_release_combination_is_evaluated_up_to_the_cap():
    """Five unknown packages with 2-5 release ranges each (320 combinations): the old cap of 256 silently dropped
    every combination with the last package's late releases, so a conditional finding read as unconditional."""
    from packaging.version import Version

    from loraflow.frontends.scenarios import MAX_SCENARIOS, Variable, enumerate_scenarios

    variables = [Variable(name, "version", [Version(f"1.{i}") for i in range(1, n)])
                 for name, n in (("a", 2), ("b", 4), ("c", 4), ("d", 5), ("e", 2))]
    combos = enumerate_scenarios(variables)
    assert len(combos) == 2 * 4 * 4 * 5 * 2 <= MAX_SCENARIOS
    assert {c["e"] for c in combos} == set(variables[-1].considered())
    big = [Variable(f"p{k}", "version", [Version(f"1.{i}") for i in range(1, 4)]) for k in range(8)]  # 4^8
    assert len(enumerate_scenarios(big)) == MAX_SCENARIOS
