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
