"""What a function of the project does that AMP rules care about, read from Python's ``ast`` of
its module: the backward passes it runs, the checkpoints it writes, the models it makes float16
— by its own code and by the project functions it calls, followed up to ``CALL_DEPTH`` calls
deep, across modules. A rule asks at a call site (``callee_summary``) what the function called
there does, so that a mistake split between a caller and its helper is seen whole.

A call is followed when the code shows where it goes: a module-level function of the same
module (``helper(...)``), a method of the same class (``self.helper(...)``), or a function
another module of the project defines, imported by name or through its module
(``from .utils import save``, ``import utils`` then ``utils.save(...)``). Anything else (a
method of an object whose class the code does not show, a function passed in) is not followed,
and adds nothing. The facts of each module are computed once per run and text."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from .names import dotted
from .outline import Outline
from .semantics import named_like_optimizer
from .project_index import module_dependency, module_text, project_module, relative_name

if TYPE_CHECKING:
    from .context import FileContext

# How many calls deep a summary follows its callees (a helper of a helper of a helper).
CALL_DEPTH = 3

_HALF = frozenset({"torch.float16", "torch.half"})
_SAVE = frozenset({"torch.save"})


@dataclass(frozen=True)
class Place:
    """A line of the project a summary points at: what is there (``loss.backward()``), and the
    functions called on the way to it from the call a rule asked about (outermost first)."""
    path: Path
    row: int
    code: str
    via: tuple[str, ...] = ()

    def shown(self, root: Path | None) -> str:
        return f"{relative_name(self.path.resolve(), root.resolve()) if root else self.path.as_posix()}:{self.row}"


@dataclass(frozen=True)
class Checkpoint:
    """A ``torch.save(...)`` a function runs: where, whether what it saves names an optimizer's
    and a GradScaler's state, and whether parts of it come from the caller (a dict parameter,
    ``**kwargs``), so that what it holds is not known here."""
    place: Place
    optimizer_state: bool
    scaler_state: bool
    from_caller: bool


@dataclass(frozen=True)
class Summary:
    name: str  # as the code calls it: `save_checkpoint`, `Trainer.step`
    place: Place  # the `def`
    params: tuple[str, ...]
    backwards: tuple[tuple[Place, bool], ...]  # each backward pass, and whether it is scaled
    scales: bool  # calls `X.scale(...)`: a GradScaler scales on some path
    checkpoints: tuple[Checkpoint, ...]
    halves: tuple[tuple[str, Place], ...]  # a parameter (or `self`) made float16, and where
    returns_half: Place | None  # returns a model or tensor it made float16


def _receiver(call: ast.Call) -> tuple[ast.expr, str] | None:
    func = call.func
    return (func.value, func.attr) if isinstance(func, ast.Attribute) else None


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _is_half_conversion(outline: Outline, call: ast.Call) -> bool:
    """``x.half()``, ``x.to(torch.float16)`` / ``x.to(dtype=torch.half)``."""
    found = _receiver(call)
    if found is None:
        return False
    if found[1] == "half" and not call.args and not call.keywords:
        return True
    if found[1] != "to":
        return False
    given = [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]
    return any(outline.qualified_names(a) & _HALF for a in given)


def _texts(expr: ast.AST) -> list[str]:
    """The names, attributes and string keys in a saved object."""
    return [node.value if isinstance(node, ast.Constant) else node.id if isinstance(node, ast.Name) else node.attr
            for node in ast.walk(expr) if isinstance(node, (ast.Name, ast.Attribute))
            or (isinstance(node, ast.Constant) and isinstance(node.value, str))]


def _names_optimizer(expr: ast.AST) -> bool:
    return any(named_like_optimizer(text) for text in _texts(expr))


def _names_scaler(expr: ast.AST) -> bool:
    return any("scaler" in text.lower() for text in _texts(expr))


def _body(function: ast.AST):
    """The nodes of a function's own code: not those of a function, lambda or class it defines
    (they run only when called)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


class _Module:
    """One module's functions and what each does by its own code, with the calls it makes to
    functions this module can locate."""

    def __init__(self, path: Path, outline: Outline, root: Path | None):
        self.path, self.outline, self.root = path, outline, root
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[int, str] = {}  # function id -> its class's name
        for stmt in outline.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                for item in stmt.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{stmt.name}.{item.name}"] = item
                        self.classes[id(item)] = stmt.name
        self.imported: dict[str, tuple[str | None, int, str | None]] = {}  # name -> (module, level, name there)
        for stmt in outline.tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.names[0].name != "*":
                for alias in stmt.names:
                    self.imported[alias.asname or alias.name] = (stmt.module, stmt.level, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        self.imported[alias.asname] = (alias.name, 0, None)
                    elif "." not in alias.name:
                        self.imported[alias.name] = (alias.name, 0, None)

    def calls_at(self, row: int) -> list[ast.Call]:
        """The calls that start on line ``row``."""
        if "_calls_at" not in self.__dict__:
            self._calls_at: dict[int, list[ast.Call]] = {}
            for node in self.outline.nodes(ast.Call):
                self._calls_at.setdefault(node.lineno, []).append(node)
        return self._calls_at.get(row, [])

    def function_at(self, row: int) -> ast.AST | None:
        """The innermost function of ``functions`` around line ``row`` (methods in a class body)."""
        return max((f for f in self.functions.values() if f.lineno <= row <= f.end_lineno),
                   key=lambda f: f.lineno, default=None)

    def callee(self, function: ast.AST | None, call: ast.Call) -> tuple[Path, str] | None:
        """The module and name of the project function ``call`` (in ``function``) runs."""
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in self.functions:
                return self.path, func.id
            found = self.imported.get(func.id)
            if found is None or found[2] is None:
                return None
            module, level, name = found
            return self._elsewhere(module, level, name)
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        if func.value.id == "self":
            cls = self.classes.get(id(function))
            qualified = f"{cls}.{func.attr}"
            return (self.path, qualified) if cls is not None and qualified in self.functions else None
        found = self.imported.get(func.value.id)
        if found is None:
            return None
        module, level, name = found
        # `import utils` (name None: the module itself) or `from pkg import utils` (a submodule)
        submodule = module if name is None else (f"{module}.{name}" if module else name)
        return self._elsewhere(submodule, level, func.attr)

    def _elsewhere(self, module: str | None, level: int, name: str) -> tuple[Path, str] | None:
        if self.root is None or not (module or level):
            return None
        path = project_module(self.root, self.path, module, level)
        return (path, name) if path is not None and path.resolve() != self.path.resolve() else None

    def facts(self, qualified: str) -> dict | None:
        """What the function does by its own code; its calls as (call, callee)."""
        function = self.functions.get(qualified)
        if function is None:
            return None
        cache = self.__dict__.setdefault("_facts", {})
        if qualified not in cache:
            cache[qualified] = self._own(function)
        return cache[qualified]

    def _own(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict:
        outline = self.outline
        params = tuple(a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs))
        backwards, checkpoints, halves, calls = [], [], [], []
        scales = False
        returns_half = None
        # names that hold a float16 model or tensor: `model.half()`, `model = net.half()`
        half_names = {t.id for node in _body(function) if isinstance(node, ast.Assign)
                      and isinstance(node.value, ast.Call) and _is_half_conversion(outline, node.value)
                      for t in node.targets if isinstance(t, ast.Name)}
        half_names |= {name for node in _body(function) if isinstance(node, ast.Call)
                       and _is_half_conversion(outline, node) and (name := _root_name(node.func.value))}
        returned = {id(n.value) for n in _body(function) if isinstance(n, ast.Return)}
        for node in _body(function):
            if isinstance(node, ast.Return) and node.value is not None:
                value = node.value
                if (isinstance(value, ast.Call) and _is_half_conversion(outline, value)) or \
                        (isinstance(value, ast.Name) and value.id in half_names):
                    returns_half = self._place(node, ast.unparse(value))
            if not isinstance(node, ast.Call):
                continue
            received = _receiver(node)
            if received is not None and received[1] == "scale" and node.args:
                scales = True
            if received is not None and received[1] == "backward" or \
                    outline.qualified_names(node.func) & {"torch.autograd.backward"}:
                scaled = received is not None and isinstance(received[0], ast.Call) \
                    and (_receiver(received[0]) or (None, ""))[1] == "scale"
                backwards.append((self._place(node, ast.unparse(node)), scaled))
            elif outline.qualified_names(node.func) & _SAVE and node.args:
                parts, from_caller = self._saved_parts(function, node.args[0], params)
                checkpoints.append((self._place(node, ast.unparse(node)), any(map(_names_optimizer, parts)),
                                    any(map(_names_scaler, parts)), from_caller))
            elif _is_half_conversion(outline, node):
                target = _root_name(received[0])
                if target is not None:
                    if target in params:
                        halves.append((target, self._place(node, ast.unparse(node))))
            callee = self.callee(function, node)
            if callee is not None:
                calls.append((node, callee, id(node) in returned))
        return {"params": params, "backwards": backwards, "scales": scales, "checkpoints": checkpoints,
                "halves": halves, "returns_half": returns_half, "calls": calls, "row": function.lineno}

    @staticmethod
    def _saved_parts(function: ast.AST, saved: ast.expr, params: tuple[str, ...]) -> tuple[list[ast.AST], bool]:
        """What a saved object is built from in the function (``state = {...}``,
        ``state["scaler"] = ...``, ``state.update(...)``), and whether some of it comes from the
        caller (it is a parameter, or takes one in whole: ``**extra``, ``state.update(extra)``)."""
        parts: list[ast.AST] = [saved]
        from_caller = False
        if isinstance(saved, ast.Name):
            bound = False
            for node in _body(function):
                if isinstance(node, ast.Assign) and any(_root_name(t) == saved.id for t in node.targets):
                    parts += [node.value, *node.targets]
                    bound = bound or any(isinstance(t, ast.Name) for t in node.targets)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "update" and _root_name(node.func.value) == saved.id:
                    given = [*node.args, *(k.value for k in node.keywords)]
                    parts += given
                    from_caller = from_caller or any(isinstance(g, ast.Name) and g.id in params for g in given)
            from_caller = from_caller or (saved.id in params and not bound)
        from_caller = from_caller or any(isinstance(p, ast.Dict) and None in p.keys for p in parts)
        return parts, from_caller

    def _place(self, node: ast.AST, code: str) -> Place:
        return Place(self.path, node.lineno, code if len(code) <= 60 else code[:57] + "...")


_MODULES: dict[tuple[Path, str], _Module | None] = {}


def _module(path: Path, text: str | None, root: Path | None) -> _Module | None:
    if text is None:
        return None
    key = (path.resolve(), text)
    if key not in _MODULES:
        if len(_MODULES) > 256:
            _MODULES.pop(next(iter(_MODULES)))
        outline = Outline.parse(text)
        _MODULES[key] = _Module(path, outline, root) if outline is not None else None
    return _MODULES[key]


def _summary(module: _Module, qualified: str, depth: int, seen: set, read: set[Path]) -> Summary | None:
    facts = module.facts(qualified)
    if facts is None:
        return None
    own_place = Place(module.path, facts["row"], f"def {qualified.rsplit('.', 1)[-1]}")
    backwards = list(facts["backwards"])
    checkpoints = [Checkpoint(*c) for c in facts["checkpoints"]]
    halves = list(facts["halves"])
    scales, returns_half = facts["scales"], facts["returns_half"]
    key = (module.path.resolve(), qualified)
    if depth > 0 and key not in seen:
        seen = seen | {key}
        for call, (path, name), returned in facts["calls"]:
            other = module if path == module.path else _module(path, module_text(path), module.root)
            if other is None:
                continue
            if other is not module:
                read.add(path)
            inner = _summary(other, name, depth - 1, seen, read)
            if inner is None:
                continue
            via = name.rsplit(".", 1)[-1]
            backwards += [(replace(p, via=(via, *p.via)), s) for p, s in inner.backwards]
            checkpoints += [replace(c, place=replace(c.place, via=(via, *c.place.via))) for c in inner.checkpoints]
            scales = scales or inner.scales
            bound = _bound(call, inner.params)
            halves += [(bound[param], replace(p, via=(via, *p.via))) for param, p in inner.halves if param in bound]
            if inner.returns_half is not None and returns_half is None and returned:
                returns_half = replace(inner.returns_half, via=(via, *inner.returns_half.via))
    return Summary(qualified, own_place, facts["params"], tuple(backwards), scales, tuple(checkpoints),
                   tuple(halves), returns_half)


def _bound(call: ast.Call, params: tuple[str, ...]) -> dict[str, str]:
    """The callee's parameters that ``call`` passes a plain name (or ``self``) to, by name."""
    offset = 1 if params[:1] == ("self",) and isinstance(call.func, ast.Attribute) else 0
    bound = {params[i + offset]: a.id for i, a in enumerate(call.args)
             if i + offset < len(params) and isinstance(a, ast.Name)}
    bound.update((k.arg, k.value.id) for k in call.keywords if k.arg in params and isinstance(k.value, ast.Name))
    if offset and isinstance(call.func.value, ast.Name):
        bound["self"] = call.func.value.id
    return bound


def callee_summary(ctx: "FileContext", call: cst.Call) -> Summary | None:
    """What the project function ``call`` runs does (None when the code does not show which
    function that is). The file's findings then depend on the text of each other module read."""
    code = dotted(call.func)
    if code is None or len(code) > 2:
        return None
    module = _module(Path(ctx.path), ctx.source, ctx.project_root())
    if module is None:
        return None
    row = ctx.location(ctx.offsets(call)[0]).row
    target = next((n for n in module.calls_at(row) if _ast_dotted(n.func) == code), None)
    if target is None:
        return None
    callee = module.callee(module.function_at(row), target)
    if callee is None:
        return None
    path, name = callee
    other = module if path == module.path else _module(path, module_text(path), module.root)
    if other is None:
        return None
    read: set[Path] = set() if other is module else {path}
    found = _summary(other, name, CALL_DEPTH - 1, set(), read)
    root = ctx.project_root()
    if root is not None:
        ctx.dependencies.update(module_dependency(root, p) for p in read)
    return found


def _ast_dotted(expr: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return [expr.id, *reversed(parts)]
