"""What a Python training script's code says, read statically (Python's `ast`; the script is never imported or run):
the calls it makes in the order they appear, each with its line and its arguments resolved as far as literals go.

A name assigned earlier (`bnb_config = BitsAndBytesConfig(...)`, `args = TrainingArguments(...)`) resolves to what
was assigned; `torch.bfloat16` to "bfloat16"; an attribute of the dataclasses HfArgumentParser fills to the
command-line flag of that name. Anything else stays an `Unread` with its text, for the frontend to list. Snippets
pasted into issues are fragments: lines that do not parse are skipped one at a time and reported with their number,
and `...` standing for elided arguments is read as nothing. The meaning of the calls is python_script.py's part.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from loraflow.frontends.script_args import field_default, record_argparse
from loraflow.frontends.script_parse import parse
from loraflow.frontends.script_passing import PARSE_CALLS, bound_once, compared, parsed_params, returns_kwargs, truth

# torch dtypes as the HF frontends spell them (`--torch_dtype bfloat16`).
_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32",
           "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Classes whose attributes are enum members read by name (`TaskType.SEQ_CLS` -> "SEQ_CLS").
_ENUMS = ("TaskType", "PeftType", "IntervalStrategy", "SchedulerType")
# What turns a command line into the script's settings; their outputs' attributes are flags.
PARSERS = ("HfArgumentParser", "TrlParser", "ArgumentParser")


@dataclass(frozen=True)
class Unread:
    """A value the code computes (a name bound to something not literal, an expression, a function's result)."""
    text: str


@dataclass(frozen=True)
class FromFlag:
    """An attribute of the arguments a parser filled from the command line: the flag `--name`."""
    name: str


@dataclass(frozen=True)
class Parsed:
    """The dataclasses (or namespace) an argument parser returns."""
    source: str


@dataclass
class Call:
    func: str
    """The callee as written: `AutoModelForCausalLM.from_pretrained`, `model.to`, `get_peft_model`."""
    line: int
    file: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    """Each keyword argument as written (for sources)."""
    splat: str = ""
    """`**config` / `*args` passed: the text of what check cannot see into."""
    owner: Any = None
    """What the method is called on: the value bound to the name (a Call, a Parsed, Unread) or the receiving call."""
    target: str = ""
    """The name this call's result is assigned to (`model = ...`)."""
    scope: str = ""
    """The function the call is written in ("" at module level)."""
    guard: tuple[tuple[str, bool], ...] = ()
    """The parsed flags the enclosing `if`s test, each with the value the call needs (`if training_args.use_lora:`
    -> ("use_lora", True)): script_setup.live drops the call when the launch line or the field's default says no."""

    @property
    def name(self) -> str:
        return self.func.rsplit(".", 1)[-1]

    @property
    def owner_name(self) -> str:
        return self.func.rsplit(".", 1)[0] if "." in self.func else ""

    def at(self, key: str | None = None) -> str:
        """Where a value came from: `train.py:12: BitsAndBytesConfig(load_in_4bit=True)`."""
        inner = f"{key}={self.texts[key]}" if key in self.texts else "..." if self.args or self.kwargs else ""
        return f"{self.file}:{self.line}: {self.func}({inner})"

    def arg(self, index: int, key: str, default: Any = None) -> Any:
        """A parameter given by position or by keyword."""
        if key in self.kwargs:
            return self.kwargs[key]
        return self.args[index] if len(self.args) > index else default


@dataclass
class Code:
    file: str
    calls: list[Call] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)
    """Imported name -> the top-level package it comes from."""
    bases: dict[str, str] = field(default_factory=dict)
    """Classes the script defines -> their first base (`class MyTrainer(SFTTrainer)`)."""
    attributes: list[tuple[str, str, Any, str]] = field(default_factory=list)
    """`owner.attr = value` assignments: (owner as written, attr, value, source), in order."""
    owners: dict[str, Any] = field(default_factory=dict)
    """For each attribute assignment's owner text: the value its root name held then."""
    replaced: list[tuple[str, str, frozenset[str], str]] = field(default_factory=list)
    """`owner.method = <a lambda or a call>`: a method replaced on an object (alpaca-lora's `model.state_dict = (lambda
    ...: get_peft_model_state_dict(...)).__get__(model)`): (owner, attr, the names the new value calls, source)."""
    skipped: list[str] = field(default_factory=list)
    """Lines that did not parse: `train.py:7: skipped (invalid syntax): <text>`."""
    elided: list[int] = field(default_factory=list)
    """Lines where `...` stands for arguments the poster left out."""
    elided_code: list[int] = field(default_factory=list)
    """Lines where `...` stands for code the poster left out (`trainer = ...`, `...` on a line of its own): the
    script is an excerpt, so what it does not show is open."""
    called: set[str] = field(default_factory=set)
    """Names of the functions and methods the script calls (the last part of each callee)."""
    refused: dict[str, str] = field(default_factory=dict)
    attribute_guards: dict[str, tuple[tuple[str, bool], ...]] = field(default_factory=dict)
    """An attribute assignment's source -> the flags its enclosing `if`s test (as Call.guard)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Literal defaults of the argument dataclasses' fields (`use_lora: bool = False`, `field(default=True)`): what
    a flag the launch line leaves out is; argparse's defaults and set_defaults too (script_args.py)."""
    dests: dict[str, str] = field(default_factory=dict)
    """A script's own option -> the argparse dest it sets, where they differ (`--with-adapter` -> use_lora)."""
    computed_defaults: dict[str, str] = field(default_factory=dict)
    """argparse dests whose default the code computes (`default=torch.cuda.get_device_capability()[0] == 8`)."""
    bool_typed: set[str] = field(default_factory=set)
    """argparse dests declared `type=bool`: any non-empty text on the launch line is True (script_args.as_parsed)."""
    """Parsed flags the script stops on (`if training_args.gradient_checkpointing: raise ...`) -> the source: a run
    that trains has them off."""

    def packages(self) -> set[str]:
        return set(self.imports.values())

    def always_runs(self, call: Call) -> bool:
        """Written at module level or in a function the script calls: not only in a hook or a callback it hands to a
        library (`accelerator.register_load_state_pre_hook(load_model_hook)` runs it on resume only)."""
        return not call.scope or call.scope in self.called


def read_code(text: str, file: str) -> Code:
    """The calls, imports and assignments of `text`; never raises on bad syntax (the lines are skipped)."""
    code = Code(file)
    tree = parse(text, code)
    reader = _Reader(code)
    reader.parsed_params = parsed_params(tree)
    reader.constants = bound_once(tree)
    reader.visit(tree)
    return code


class _Reader(ast.NodeVisitor):
    """Walks the statements in source order (function bodies included, as if run where they are written)."""

    def __init__(self, code: Code):
        self.code = code
        self.env: dict[str, Any] = {}
        self.seen: dict[int, Call] = {}
        self.scopes: list[str] = []
        self.guards: list[tuple[str, bool]] = []
        self.signatures: dict[str, ast.arguments] = {}
        self.parsed_params: dict[str, set[str]] = {}
        self.kwarg_returners: set[str] = set()
        self.constants: set[str] = set()
        """Names bound once in the whole file: the only ones whose value decides an `if` (script_passing.truth)."""
        self.parsers: dict[str, Parsed | dict] = {}
        """The script's own functions that return a parser's output (`def parse_arge(): ... return
        parser.parse_known_args()`: calling one is parsing) or a dict they write out."""

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.signatures[node.name] = node.args
        if returns_kwargs(node):
            self.kwarg_returners.add(node.name)
        for param in self.parsed_params.get(node.name, ()):  # `def main(args)` called as `main(parse_args())`
            self.env[param] = Parsed(f"{self.code.file}:{node.lineno}: {node.name}({param}) (the parsed arguments)")
        self.scopes.append(node.name)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> None:
        value = self.value(node.value) if node.value is not None else None
        if isinstance(value, (Parsed, dict)) and self.scopes:
            # A helper of the script's own returning a dict it writes out (DeepSpeed-Chat's get_train_ds_config):
            # its call is that dict; what it computes from its parameters stays unread inside it.
            self.parsers[self.scopes[-1]] = value

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.code.imports[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        package = (node.module or "").split(".")[0]
        for alias in node.names:
            self.code.imports[alias.asname or alias.name] = package

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.bases:
            self.code.bases[node.name] = ast.unparse(node.bases[0]).rsplit(".", 1)[-1]
        for item in node.body:  # a dataclass field's literal default: the flag's value when the line omits it
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                default = field_default(item.value)
                if default is not None:
                    self.code.defaults.setdefault(item.target.id, default)
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        decided = truth(node.test, self.constant)
        if decided is not None:  # `if USE_LORA:` with `USE_LORA = False` above: only the branch that runs is read
            for child in node.body if decided else node.orelse:
                self.visit(child)
            return
        test = self.value(node.test)
        if isinstance(test, FromFlag) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise):
            self.code.refused[test.name] = f"{self.code.file}:{node.lineno}: if {ast.unparse(node.test)}: raise"
        body, orelse = self.flag_tests(node.test)
        before = dict(self.env)
        bound: list[dict[str, Any]] = []
        for children, guard in ((node.body, body), (node.orelse, orelse)):
            self.env = dict(before)
            self.guards.extend(guard)
            for child in children:
                self.visit(child)
            del self.guards[len(self.guards) - len(guard):]
            bound.append(self.env)
        self.env = dict(before)
        for name in set(bound[0]) | set(bound[1]):
            changed = [b[name] for b in bound if name in b and (name not in before or b[name] is not before[name])]
            self.env[name] = changed[-1] if changed else before[name]
            if len(changed) == 1 and isinstance(changed[0], dict) and isinstance(before.get(name), dict):
                # `if args.load_in_8bit: model_kwargs.update(load_in_8bit=True)`: only the keys the branch changes
                # depend on the test.
                self.env[name] = _either(before[name], changed[0], name, node.lineno)
            # Two parsers' outputs (`parse_json_file(...)` if a JSON is given, else `parse_args_into_dataclasses()`)
            # are the same arguments either way.
            if len(changed) == 2 and not any(isinstance(v, Call) for v in changed) and changed[0] != changed[1] \
                    and not all(isinstance(v, Parsed) for v in changed):
                # Both branches assign it, differently (Qwen-VL's `modules_to_save = None` for a chat model, else
                # ["wte", "lm_head"]): which one holds is the test's, not the later line's.
                self.env[name] = Unread(f"{name} (either branch of the `if` at line {node.lineno})")

    def constant(self, node: ast.AST) -> Any:
        """A value for deciding a branch: a name only where the file binds it once (`USE_QLORA = False` that a later
        `USE_QLORA = args.low_mem` reassigns decides nothing)."""
        if isinstance(node, ast.Name) and node.id not in self.constants:
            return Unread(node.id)
        return self.value(node)

    def flag_tests(self, node: ast.AST) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
        """What an `if` over parsed flags needs in its body and in its else: `if a.x:` ([(x, True)], [(x, False)]),
        `if not a.x:` the reverse, `if a.x and a.y:` both on in the body (its else needs only one off: nothing)."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            body, orelse = self.flag_tests(node.operand)
            return orelse, body
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            tests = [self.flag_tests(v)[0] for v in node.values]
            return [t for test in tests if len(test) == 1 for t in test], []
        flag = self.value(node) if isinstance(node, ast.Attribute) else None
        return ([(flag.name, True)], [(flag.name, False)]) if isinstance(flag, FromFlag) else ([], [])

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.value(node.value)
        for target in node.targets:
            self.bind(target, value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.bind(node.target, self.value(node.value), node)

    def visit_Expr(self, node: ast.Expr) -> None:
        self.value(node.value)

    def visit_Call(self, node: ast.Call) -> None:  # calls inside other statements (return, if, with, for...)
        self.value(node)

    def bind(self, target: ast.AST, value: Any, node: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            if isinstance(value, Call) and not value.target:
                value.target = target.id
        elif isinstance(target, (ast.Tuple, ast.List)):
            # `model, tokenizer = FastLanguageModel.from_pretrained(...)`: the first name gets the call; a parser's
            # `model_args, training_args = parser.parse_args_into_dataclasses()`: every name is its output.
            names = [t for t in target.elts if isinstance(t, ast.Name)]
            for i, name in enumerate(names):
                parsed = isinstance(value, Parsed)
                self.env[name.id] = value if parsed or i == 0 else Unread(name.id)
            if isinstance(value, Call) and names and not value.target:
                value.target = names[0].id
        elif isinstance(target, ast.Subscript):
            self.bind_key(target, value)
        elif isinstance(target, ast.Attribute):
            owner = ast.unparse(target.value)
            root = target.value
            while isinstance(root, ast.Attribute):
                root = root.value
            self.code.owners[owner] = self.env.get(root.id) if isinstance(root, ast.Name) else None
            source = f"{self.code.file}:{node.lineno}: {ast.unparse(target)} = {_short(ast.unparse(node.value))}"
            self.code.attributes.append((owner, target.attr, value, source))
            if self.guards:
                self.code.attribute_guards[source] = tuple(self.guards)
            new = getattr(node, "value", None)
            if isinstance(new, (ast.Lambda, ast.Call)):
                called = frozenset(_callee_name(c) for c in ast.walk(new) if isinstance(c, ast.Call))
                self.code.replaced.append((owner, target.attr, called, source))

    def bind_key(self, target: ast.Subscript, value: Any) -> None:
        """`ds_config["zero_optimization"]["stage"] = 3`: a new dict bound to the root name, with the key set (the
        dicts on the way copied, so the value an earlier call took is kept); a key the code computes is not read."""
        keys: list[Any] = []
        node: ast.AST = target
        while isinstance(node, ast.Subscript):
            keys.insert(0, self.value(node.slice))
            node = node.value
        if not isinstance(node, ast.Name) or not isinstance(self.env.get(node.id), dict) or \
                not all(isinstance(k, (str, int)) for k in keys):
            return
        root = dict(self.env[node.id])
        held = root
        for key in keys[:-1]:
            inner = held.get(key)
            if not isinstance(inner, dict):  # `cfg["a"]["b"] = v` where cfg["a"] is computed: it stays unread
                return
            held[key] = dict(inner)
            held = held[key]
        held[keys[-1]] = value
        self.env[node.id] = root

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.env.get(node.id, Unread(node.id))
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.value(e) for e in node.elts if not _nothing(e)]
            return _known(items, node)
        if isinstance(node, ast.Dict):
            keys = [self.value(k) if k is not None else Unread("**") for k in node.keys]
            values = [self.value(v) for v in node.values]
            # Literal keys keep the dict: a value the code computes (`"train_micro_batch_size_per_gpu": args.bs`) stays
            # an Unread / FromFlag inside it, for the reader of that key to list. Computed keys or `**` hide them all.
            known = _known(keys, node)
            return dict(zip(keys, values)) if not isinstance(known, Unread) else known
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return -node.operand.value
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Compare):
            found = compared(node, self.value)
            if found is not None:
                return found
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.IfExp) and (decided := truth(node.test, self.constant)) is not None:
            return self.value(node.body if decided else node.orelse)  # `x if USE_QLORA else None`
        for child in ast.walk(node):  # record the calls inside other expressions (`f(x) if c else g(y)`)
            if isinstance(child, ast.Call) and child is not node:
                self.call(child)
        return Unread(ast.unparse(node))

    def attribute(self, node: ast.Attribute) -> Any:
        text = ast.unparse(node)
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id == "torch" and node.attr in _DTYPES:
            return _DTYPES[node.attr]
        if isinstance(owner, ast.Name) and owner.id in _ENUMS:
            return node.attr
        if isinstance(owner, ast.Name) and isinstance(self.env.get(owner.id), Parsed):
            return FromFlag(node.attr)
        if isinstance(owner, (ast.Call, ast.Attribute)):
            self.value(owner)
        return Unread(text)

    def call(self, node: ast.Call) -> Any:
        if id(node) in self.seen:
            return self.seen[id(node)]
        func = node.func
        owner: Any = None
        if isinstance(func, ast.Attribute):
            base = func.value
            owner = self.value(base) if not isinstance(base, ast.Name) else self.env.get(base.id)
            name = f"{_short(ast.unparse(base), 40) if not isinstance(base, ast.Call) else _callee(base)}.{func.attr}"
        else:
            name = ast.unparse(func)
        if name in self.kwarg_returners:  # `def extract_kwargs(**kwargs): return kwargs`: the call's keywords
            return {kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg is not None}
        if name in self.parsers:
            held = self.parsers[name]
            return self.bound(held, node, self.signatures.get(name)) if isinstance(held, dict) else held
        if name.rsplit(".", 1)[-1] in PARSE_CALLS:
            return Parsed(f"{self.code.file}:{node.lineno}: {name}()")
        call = Call(name, node.lineno, self.code.file, owner=owner, scope=self.scopes[-1] if self.scopes else "",
                    guard=tuple(self.guards))
        self.seen[id(node)] = call
        self.code.called.add(name.rsplit(".", 1)[-1])
        for arg in node.args:
            if _nothing(arg):
                continue
            if isinstance(arg, ast.Starred):
                call.splat = call.splat or ast.unparse(arg)
            else:
                call.args.append(self.value(arg))
        for kw in node.keywords:
            if kw.arg is None:
                self.spread(call, kw.value)
                continue
            call.kwargs[kw.arg] = self.value(kw.value)
            call.texts[kw.arg] = _short(ast.unparse(kw.value))
        self.code.calls.append(call)
        if name.endswith((".add_argument", ".set_defaults")):  # what `args.X` is when the launch line omits X
            record_argparse(self.code, node, name)
        if name.endswith(".update") and isinstance(self.env.get(name[:-7]), dict):
            self.updated(name[:-7], node)
        if name == "dict" and not call.args and not call.splat:
            return dict(call.kwargs)  # dict(use_reentrant=False) is the literal {"use_reentrant": False}
        return call


    def bound(self, held: dict, node: ast.Call, signature: ast.arguments | None) -> dict:
        """A helper's returned dict with its parameters replaced by what this call passes (`get_train_ds_config(
        offload=False, stage=args.zero_stage)` -> "stage": args.zero_stage), else by their literal defaults."""
        if signature is None:
            return dict(held)
        names = [a.arg for a in signature.posonlyargs + signature.args]
        given: dict[str, Any] = {}
        for name, default in zip(names[len(names) - len(signature.defaults):], signature.defaults):
            if isinstance(default, ast.Constant):
                given[name] = default.value
        given.update({n: self.value(a) for n, a in zip(names, node.args) if not isinstance(a, ast.Starred)})
        given.update({kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg is not None})

        def swap(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: swap(v) for k, v in value.items()}
            return given.get(value.text, value) if isinstance(value, Unread) else value
        return swap(held)

    def keywords(self, node: ast.AST) -> dict | None:
        """A dict written out or built earlier (`{"load_in_8bit": True}`, `dict(bf16=True)`) as keywords, or None."""
        if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                              for k in node.keys):
            return {k.value: self.value(v) for k, v in zip(node.keys, node.values)}
        value = self.value(node)
        return value if isinstance(value, dict) and all(isinstance(k, str) for k in value) else None

    def spread(self, call: Call, node: ast.AST) -> None:
        """`f(**model_kwargs)` of a dict the script built: its keys are f's keywords (ones written out win)."""
        held = self.keywords(node)
        if held is None:
            call.splat = call.splat or f"**{ast.unparse(node)}"
            return
        for key, value in held.items():
            if key not in call.kwargs:
                call.kwargs[key] = value
                shown = value.text if isinstance(value, Unread) else f"{value.func}(...)" if isinstance(value, Call) \
                    else _short(repr(value), 40)
                call.texts[key] = f"{shown} (in **{_short(ast.unparse(node), 30)})"

    def updated(self, name: str, node: ast.Call) -> None:
        """`model_kwargs.update({...})` / `.update(key=value)`: a new dict bound to the name (as an assignment)."""
        new = dict(self.env[name])
        for arg in node.args:
            held = self.keywords(arg)
            if held is None:
                self.env[name] = Unread(name)
                return
            new.update(held)
        new.update({kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg is not None})
        self.env[name] = new


def _either(before: dict, after: dict, name: str, line: int) -> dict:  # the keys one branch changed are unread
    return {k: after[k] if before.get(k, Unread) == after.get(k, Unread) else
            Unread(f"{name}[{k!r}], set under the `if` at line {line}") for k in {**before, **after}}


def _known(items: list[Any], node: ast.AST) -> Any:
    if any(isinstance(i, (Unread, Call, Parsed, FromFlag)) for i in items):
        return Unread(ast.unparse(node))
    return list(items) if not isinstance(node, ast.Dict) else items


def _nothing(node: ast.AST) -> bool:
    """`*()`: what an elided `...` was read as."""
    return isinstance(node, ast.Starred) and isinstance(node.value, ast.Tuple) and not node.value.elts


def _callee_name(node: ast.Call) -> str:
    """The last part of what a call calls: `get_peft_model_state_dict`, `__get__`."""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _callee(node: ast.Call) -> str:
    return _short(ast.unparse(node.func), 40) + "(...)"


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
