"""The defaults of a script's own argparse flags: `parser.add_argument("--use_lora", action="store_true")` makes
`args.use_lora` False when the launch line leaves the flag out, as an argument dataclass's field default does (read
in script_code.py). A guard such as `if args.use_lora:` is then decided for a launch that omits the flag."""

from __future__ import annotations

import ast
from typing import Any

_ACTIONS = {"store_true": False, "store_false": True}


def record_argparse(code: Any, node: ast.Call, name: str) -> None:
    """An `add_argument(...)` or `set_defaults(...)` call into `code.defaults` (dest -> literal default; set_defaults
    wins, as argparse applies it over the arguments' own) and `code.dests` (option -> dest where they differ, so
    `--with-adapter` given on the launch line reaches `args.use_lora`)."""
    if name.endswith(".set_defaults"):
        code.defaults.update({kw.arg: kw.value.value for kw in node.keywords
                              if kw.arg and isinstance(kw.value, ast.Constant)})
        return
    found = argparse_default(node)
    if found is None:
        return
    dest, default, options = found
    code.dests.update({o: dest for o in options if o != dest})
    kind = next((kw.value for kw in node.keywords if kw.arg == "type"), None)
    if isinstance(kind, ast.Name) and kind.id == "bool":
        code.bool_typed.add(dest)
    if default is not None:
        code.defaults.setdefault(dest, default)
    computed = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
    if default is None and computed is not None and not isinstance(computed, ast.Constant):
        code.computed_defaults.setdefault(dest, ast.unparse(computed))


def argparse_default(node: ast.Call) -> tuple[str, Any, list[str]] | None:
    """(dest, default, long options as flag names) of one `add_argument(...)` call; the default is a literal bool,
    int or str, else None. The dest is argparse's: `dest=`, else the first long option with its dashes made
    underscores."""
    options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [o[2:].replace("-", "_") for o in options if o.startswith("--")]
    kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
    dest = kwargs.get("dest")
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        name = dest.value
    elif longs:
        name = longs[0]
    else:
        return None
    default = kwargs.get("default")
    if isinstance(default, ast.Constant) and isinstance(default.value, (bool, int, str)):
        return name, default.value, longs
    action = kwargs.get("action")
    if default is None and isinstance(action, ast.Constant) and action.value in _ACTIONS:
        return name, _ACTIONS[action.value], longs
    return name, None, longs


def field_default(node: ast.AST) -> Any:
    """`False` or `field(default=False)`: the literal (bool, int, str) a dataclass field defaults to, else None."""
    callee = node.func if isinstance(node, ast.Call) else None
    if getattr(callee, "id", getattr(callee, "attr", None)) == "field":  # field(...) or dataclasses.field(...)
        node = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, str)):
        return node.value
    return None


def as_parsed(code: Any, dest: str, value: Any, source: str) -> tuple[Any, str]:
    """A launch-line value as the script's parser gives it to the code. argparse's `type=bool` calls bool() on the
    text, so `--bf16 False` is True (only an empty string is False): the source says so where it matters."""
    if dest not in code.bool_typed or not isinstance(value, str):
        return value, source
    parsed = value != ""
    if value.strip().lower() in ("false", "0", "no", "off"):
        source = (f"{source} (the script declares it type=bool, and bool({value!r}) is True: argparse turns any "
                  "non-empty text on; leave the flag out, or declare it with action='store_true')")
    return parsed, source

