"""Values that reach a training script's own functions and expressions, for script_code.py's reader: the parsed
arguments a script hands to its entry point (`main(parse_args())`, `args = parser.parse_args(); train(args)`:
inside, `args.gradient_checkpointing` is the flag, as at module level), and comparisons of values the reader knows
(`bf16=torch_dtype == torch.bfloat16`, LazarusNLP/SemEval2025-Emotion-Analysis's run_sft_instruct_qlora.py)."""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable

# The calls whose result is a parser's output (script_code.py reads them as Parsed).
PARSE_CALLS = ("parse_args_into_dataclasses", "parse_args", "parse_known_args", "parse_args_and_config",
               "parse_yaml_file", "parse_json_file", "parse_dict")
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not}


def _parses(node: ast.AST, parsed_names: set[str]) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in PARSE_CALLS
    return isinstance(node, ast.Name) and node.id in parsed_names


def parsed_params(tree: ast.Module) -> dict[str, set[str]]:
    """Each function of the script -> its parameters that a call passes the parsed arguments to (by position or by
    keyword): `def main(args)` called as `main(parse_args())` or `main(args)` after `args = parser.parse_args()`."""
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    parsed_names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _parses(n.value, set())
                    for t in n.targets if isinstance(t, ast.Name)}
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions):
            continue
        signature = functions[node.func.id].args
        names = [a.arg for a in signature.posonlyargs + signature.args]
        for name, arg in zip(names, node.args):
            if _parses(arg, parsed_names):
                found.setdefault(node.func.id, set()).add(name)
        for kw in node.keywords:
            if kw.arg in names and _parses(kw.value, parsed_names):
                found.setdefault(node.func.id, set()).add(kw.arg)
    return found


def compared(node: ast.Compare, value: Callable[[ast.AST], Any]) -> Any:
    """`a == b` / `a != b` / `a is None` of two values the reader knows (literals, torch dtypes): the bool; else None
    (the reader keeps the expression unread)."""
    if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
        return None
    left, right = value(node.left), value(node.comparators[0])
    known = (str, int, float, bool, type(None))
    if not (isinstance(left, known) and isinstance(right, known)):
        return None
    return _COMPARE[type(node.ops[0])](left, right)


def returns_kwargs(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """`def extract_kwargs(**kwargs): return kwargs`: a helper whose call is the dict of its keywords
    (advx-25-cdss/model's train/trainer.py builds its TrainingArguments keywords so)."""
    kwarg = node.args.kwarg
    return kwarg is not None and any(isinstance(s, ast.Return) and isinstance(s.value, ast.Name) and
                                     s.value.id == kwarg.arg for s in node.body)


def truth(node: ast.AST, value: Callable[[ast.AST], Any]) -> bool | None:
    """The truth of an `if` test or a conditional expression's test over values the reader knows: a module constant
    (`USE_LORA = False` then `if USE_QLORA or USE_LORA:`, SmolVLM's and many notebooks' switches), `not`, `and`/`or`,
    a comparison of known values. None when any part is not known (a flag, a call): both branches stay possible."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = truth(node.operand, value)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        parts = [truth(v, value) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in parts else None if None in parts else True
        return True if True in parts else None if None in parts else False
    if isinstance(node, (ast.Name, ast.Constant, ast.Compare)):
        known = value(node)
        return bool(known) if isinstance(known, (bool, int, float, str, type(None))) else None
    return None


def bound_once(tree: ast.AST) -> set[str]:
    """Names the file binds exactly once: one assignment, and no augmented assignment, loop or `with` target,
    `global`, parameter, import or definition of the same name anywhere."""
    counts: dict[str, int] = {}

    def bind(name: str, weight: int = 1) -> None:
        counts[name] = counts.get(name, 0) + weight

    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [
                getattr(node, "target", None)] if not isinstance(node, ast.With) else [
                i.optional_vars for i in node.items]
            for target in filter(None, targets):
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    bind(name, 1 if isinstance(node, (ast.Assign, ast.AnnAssign)) else 2)
        elif isinstance(node, ast.Global):
            for name in node.names:
                bind(name, 2)
        elif isinstance(node, ast.arg):
            bind(node.arg, 2)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(node.name, 2)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bind((alias.asname or alias.name).split(".")[0], 2)
    return {name for name, n in counts.items() if n == 1}

