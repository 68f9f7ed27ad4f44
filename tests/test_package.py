"""The shape of the package: its import graph has no cycle, the verification harnesses sit beside the product
(never imported by it), nothing below the trainer imports the trainer, run or a stage, and each stage and engine
fact is read from its table (stagespec.py, enginespec.py) instead of string checks scattered through the code."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

import loraflow
from loraflow.enginespec import ENGINE_NAMES, ENGINES, VARIANTS, engine_class
from loraflow.stagespec import STAGES, stage_module

SRC = Path(loraflow.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every loraflow module `name` imports, at the top or inside a function, as the module it names (a
    `from package import submodule` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    assert _cycles() == []


def test_the_graph_sees_imports_inside_functions():
    # run/train.py imports the pipeline at the top and the environment inside `_train`: both are edges.
    assert {"loraflow.run.pipeline", "loraflow.environment"} <= GRAPH["loraflow.run.train"]


def _importers(target) -> set[str]:
    return {m for m, deps in GRAPH.items() if any(target(d) for d in deps)}


def test_no_product_module_imports_the_verification_package():
    verify = lambda m: m == "loraflow.verify" or m.startswith("loraflow.verify.")
    assert {m for m in _importers(verify) if not verify(m)} == set()


def test_nothing_below_the_trainer_imports_the_trainer_run_or_a_stage():
    above = lambda m: m.startswith(("loraflow.stages.", "loraflow.verify.")) or m in ("loraflow.commands.cli",)
    assert {m for m in _importers(lambda d: d == "loraflow.loop.trainer") if not above(m)} == set()
    assert {m for m in _importers(lambda d: d == "loraflow.run.train") if not above(m)} == set()
    stage = lambda d: d == "loraflow.stages" or d.startswith("loraflow.stages.")
    assert {m for m in _importers(stage) if not above(m)} == set()
    # The one way to a stage's module is its table entry (stagespec.stage_module), read by the pipeline.
    dynamic = [m for m, path in MODULES.items() if '"loraflow.stages.' in path.read_text()
               and m not in ("loraflow.stagespec",) and not m.startswith("loraflow.stages.")]
    assert dynamic == []


def _stage_name_checks(path: Path) -> list[int]:
    """Lines comparing something called *stage to a stage name: `stage in ("grpo", "ppo")`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in STAGES for k in node.keys):
            lines.append(node.lineno)  # {"rm": "score"}.get(config.stage, "lm")
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        named = (left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", "")) or ""
        if not named.endswith("stage"):
            continue
        for comparator in node.comparators:
            values = comparator.elts if isinstance(comparator, (ast.Tuple, ast.List, ast.Set)) else [comparator]
            if any(isinstance(v, ast.Constant) and v.value in STAGES for v in values):
                lines.append(node.lineno)
    return lines


def _engine_name_checks(path: Path) -> list[int]:
    """Lines comparing something called *engine to an engine's name (`s.engine == "fsdp2"`,
    `engine in ("fsdp1", "fsdp2")`): what an engine does is a capability of its table entry."""
    names = set(ENGINES) | set(VARIANTS)
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any((s.attr if isinstance(s, ast.Attribute) else getattr(s, "id", "")).endswith("engine")
                    for s in sides)
        values = [v for s in sides for v in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])]
        if named and any(isinstance(v, ast.Constant) and v.value in names for v in values):
            lines.append(node.lineno)
    return lines


def test_engine_facts_come_from_the_engine_table():
    # frontends read other frameworks' engine flags, which are those frameworks' facts; probes build the naive
    # setups of other frameworks by name.
    found = {m: lines for m, path in MODULES.items()
             if not m.startswith(("loraflow.frontends", "loraflow.enginespec"))
             and (lines := _engine_name_checks(path))}
    assert found == {}


def test_the_checker_finds_an_engine_string_check(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(s):\n    return s.engine == 'fsdp2'\n\n\ndef g(engine):\n    return engine in ('ddp', 'x')\n")
    assert _engine_name_checks(probe) == [2, 6]


def test_stage_facts_come_from_the_stage_table():
    # frontends read other frameworks' stage names, which are those frameworks' facts, not loraflow's.
    found = {m: lines for m, path in MODULES.items()
             if not m.startswith("loraflow.frontends") and (lines := _stage_name_checks(path))}
    assert found == {}


def test_the_checker_finds_a_stage_string_check(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(config):\n    return config.stage in ('grpo', 'ppo')\n\n\n"
                     "def g(config):\n    return {'rm': 'score'}.get(config.stage, 'lm')\n")
    assert _stage_name_checks(probe) == [2, 6]


def test_every_declared_stage_and_engine_has_its_implementation():
    for name, spec in STAGES.items():
        module = stage_module(name)
        assert callable(module.build), name
        assert spec.phases[-1].train and all(not p.train for p in spec.phases[:-1]), name
    from loraflow.engines import Engine

    for name in ENGINE_NAMES:  # the engines loraflow runs (the table also describes FSDP1 for `check`)
        cls = engine_class(name)
        assert issubclass(cls, Engine) and cls.name == name, name


def test_the_family_table_is_on_the_ground_floor():
    # plan, setup, data, engines and frontends all read loraflow.families, so it can import none of them.
    assert GRAPH["loraflow.families"] <= {"loraflow.errors"}


def _decision_keys(path: Path) -> set[str]:
    """The keys of the Decisions a module words: `Decision("engine", ...)`."""
    return {node.args[0].value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Decision"
            and node.args and isinstance(node.args[0], ast.Constant)}


def test_each_decision_is_worded_in_its_plan_area_only():
    # A choice and its reason live in one module of plan/ (plan/__init__.py lists the areas): no Decision is worded
    # outside plan/, and no key is worded by two areas.
    keys = {m: _decision_keys(path) for m, path in MODULES.items()}
    assert {m for m, k in keys.items() if k and not m.startswith("loraflow.plan.")} == set()
    owners: dict[str, list[str]] = {}
    for m, found in keys.items():
        for key in found:
            owners.setdefault(key, []).append(m)
    assert {k: ms for k, ms in owners.items() if len(ms) > 1} == {}
    assert len(owners) >= 30  # the checker sees the plan's decisions


def test_only_the_plan_package_reaches_into_its_areas():
    # Callers take `resolve` and the Plan from loraflow.plan; the areas are the plan's own business.
    area = lambda d: d.startswith("loraflow.plan.") and d != "loraflow.plan.types"
    assert {m for m in _importers(area) if not m.startswith("loraflow.plan")} == set()


ROOMS = {
    0: {"loraflow", "errors", "environment", "families", "enginespec", "stagespec", "locations", "phases"},
    1: {"config", "losses", "rules", "checkpoints"},
    2: {"data", "engines", "frontends"},
    3: {"setup", "explain"},
    4: {"plan", "loop", "rl"},
    5: {"stages"},
    6: {"run"},
    7: {"probes"},
    8: {"commands"},
    9: {"__main__", "verify"},
}
"""The package's floors, bottom up: the tables and facts everything reads (the ground floor, at the package root,
whose modules may read each other: the graph has no cycle), then the rooms. A module imports only rooms on lower
floors (and its own room)."""


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_import_goes_down_a_floor():
    floor = {room: level for level, rooms in ROOMS.items() for room in rooms}
    assert {_room(m) for m in MODULES} <= set(floor), "a new room needs its floor in ROOMS"
    upward = sorted((m, d) for m, deps in GRAPH.items() for d in deps
                    if _room(m) != _room(d) and floor[_room(d)] >= max(floor[_room(m)], 1))
    assert upward == []


def test_the_package_root_holds_only_the_ground_floor():
    root = {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
    assert root == ROOMS[0] - {"loraflow"}


def test_no_function_is_over_80_lines():
    # A function that long mixes jobs (frontends' `apply` was 238 lines before its flag tables).
    long = [(m, n.name, n.end_lineno - n.lineno + 1) for m, path in MODULES.items()
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


def test_every_data_file_the_code_reads_is_packaged():
    """A non-editable install (the device check's) carries only what package-data names: a JSON table a frontend
    reads at import (verl_keys.json) missing from it broke every command there."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["loraflow"]
    package = ROOT / "src" / "loraflow"
    data = [p.relative_to(package).as_posix() for p in package.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    unpackaged = [f for f in data if not any(fnmatch.fnmatch(f, pat) or f.startswith(pat.split("**")[0]) and
                                             "**" in pat for pat in patterns)]
    assert not unpackaged, f"add to [tool.setuptools.package-data] in pyproject.toml: {unpackaged}"
