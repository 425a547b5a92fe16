"""What a function of the project does that AMP rules care about, read from Python's ``ast`` of
its module: the backward passes it runs, the checkpoints it writes, the models it makes float16
— by its own code and by the project functions it calls, followed up to ``CALL_DEPTH`` calls
deep, across modules. A rule asks at a call site (``callee_summary``) what the function called
there does, so that a mistake split between a caller and its helper is seen whole.

A call is followed when the code shows where it goes: a module-level function of the same
module (``helper(...)``), a method of the same class (``self.helper(...)``), a function
another module of the project defines, imported by name or through its module
(``from .utils import save``, ``import utils`` then ``utils.save(...)``), or a method of an
object the function (or the module's top level) builds from a project class and binds to a
name nothing else binds (``net = Net(cfg).cuda()`` then ``net.to_half()``), looked up as
Python looks it up: the class, then its bases, up to a base another library defines. Anything
else (a method of an object whose class the code does not show, a function passed in) is not
followed, and adds nothing. The facts of each module are computed once per run and text.

A conversion to float16 carries the conditions it runs under in its function (``if``
tests, an ``if``-expression choosing its dtype): a condition that is a parameter of the
function is answered by what the caller passes, or the default."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .classes import bases_in_order
from .outline import ModulesByText, Outline, child_nodes, contains, dotted, named_parameters, parameter_defaults, walk
from .semantics import named_like_optimizer, steps_optimizer
from .project_index import dependency, module_dependency, module_text, project_module, project_name, summarized_by

if TYPE_CHECKING:
    from .ast_context import AstContext
    from .checked_file import CheckedFile

# How many calls deep a summary follows its callees (a helper of a helper of a helper).
CALL_DEPTH = 3

_HALF = frozenset({"torch.float16", "torch.half"})
_SAVE = frozenset({"torch.save"})
# A module's methods that return the module itself: `net.cuda().half()` converts `net`.
_SAME_MODULE = frozenset({"cuda", "cpu", "to", "train", "eval", "requires_grad_"})
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COLLECTING = frozenset({"append", "extend", "add", "update"})  # methods that put their arguments in a collection


@dataclass(frozen=True)
class Place:
    """A line of the project a summary points at: what is there (``loss.backward()``), and the
    functions called on the way to it from the call a rule asked about (outermost first)."""
    path: Path
    row: int
    code: str
    via: tuple[str, ...] = ()
    # What must hold for it to run: (condition's code, whether it holds), outermost first.
    when: tuple[tuple[str, bool], ...] = ()


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
    halves: tuple[tuple[str, Place], ...]  # a parameter (or `self`) made float16 as a whole, and where
    returns_half: Place | None  # every `return` returns a model it made float16 (the first conversion)
    # The parameters it never rebinds, each with its default's code (None: no default).
    defaults: tuple[tuple[str, str | None], ...] = ()
    steps: bool = False  # steps an optimizer (``steps_optimizer``) on some path


@dataclass(frozen=True)
class MadeHalf:
    """A model a call of a project function makes float16 (``made_half``)."""
    model: str | None  # the caller's code for the argument converted (the receiver for `self`); None: the result
    place: Place  # the conversion: its `via` leads there from the call, its `when` in the caller's terms


def receiver(call: ast.Call) -> tuple[ast.expr, str] | None:
    func = call.func
    return (func.value, func.attr) if isinstance(func, ast.Attribute) else None


def is_backward(outline: Outline, call: ast.Call) -> bool:
    """A tensor's backward pass, by the call's shape: ``loss.backward()``,
    ``S.scale(loss).backward()`` (no positional argument), ``torch.autograd.backward(...)``.
    ``accelerator.backward(loss)`` and other wrappers that take the loss as an argument are
    not; ``torch.autograd.backward(loss)`` is one, with the loss positional."""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    return method == "backward" and not call.args or "torch.autograd.backward" in outline.qualified_names(call.func)


# Methods by which a framework runs the backward pass of the loss it is given, scaling it as its
# precision setting says: Lightning's `self.manual_backward(loss)`, mmengine's
# `optim_wrapper.update_params(loss)` (which steps the optimizer too).
FRAMEWORK_BACKWARDS = frozenset({"manual_backward", "update_params"})


def framework_backward(call: ast.Call) -> bool:
    """A framework's backward pass of the loss given to it (``FRAMEWORK_BACKWARDS``)."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in FRAMEWORK_BACKWARDS and len(call.args) >= 1


def backward_tensor(call: ast.Call) -> ast.expr | None:
    """The tensor a backward pass differentiates: ``loss`` of ``loss.backward()`` or
    ``torch.autograd.backward(loss)``."""
    positional = next((a for a in call.args if not isinstance(a, ast.Starred)), None)
    method = receiver(call)
    return method[0] if method is not None and method[1] == "backward" and positional is None else positional


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _module_root(expr: ast.expr) -> str | None:
    """The name of the module ``expr`` is, through methods that return it (``net.cuda()``)."""
    while isinstance(expr, ast.Call) and (found := receiver(expr)) is not None and found[1] in _SAME_MODULE:
        expr = found[0]
    return expr.id if isinstance(expr, ast.Name) else None


def _test(test: ast.expr, holds: bool) -> tuple[str, bool]:
    """A condition as code and whether it holds, ``not x`` as ``x`` that fails."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, holds = test.operand, not holds
    return ast.unparse(test), holds


def guards_of(function: ast.AST) -> dict[int, tuple[tuple[str, bool], ...]]:
    """The conditions each node of a function's own code runs under (``if`` statements and
    ``if``-expressions around it), outermost first."""
    found: dict[int, tuple[tuple[str, bool], ...]] = {}
    stack: list[tuple[ast.AST, tuple]] = [(child, ()) for child in child_nodes(function)]
    while stack:
        node, conditions = stack.pop()
        found[id(node)] = conditions
        if isinstance(node, (ast.If, ast.IfExp)):
            branches = (node.body, node.orelse) if isinstance(node, ast.If) else ([node.body], [node.orelse])
            stack.append((node.test, conditions))
            for branch, holds in zip(branches, (True, False)):
                stack += [(child, (*conditions, _test(node.test, holds))) for child in branch]
        elif not isinstance(node, _NESTED):
            stack += [(child, conditions) for child in child_nodes(node)]
    return found


def _float16_when(outline: Outline, expr: ast.expr, assigned: dict[str, ast.expr], depth: int = 2):
    """The conditions under which the dtype ``expr`` is float16: none for ``torch.float16``,
    an ``if``-expression's test (``torch.float16 if args.fp16 else torch.float32``), through a
    name the function assigns once; None where it is not shown to be float16."""
    if isinstance(expr, ast.Name) and expr.id in assigned and depth:
        return _float16_when(outline, assigned[expr.id], {}, depth - 1)
    if outline.qualified_names(expr) & _HALF:
        return ()
    if isinstance(expr, ast.IfExp):
        body, orelse = (_float16_when(outline, e, {}, 0) for e in (expr.body, expr.orelse))
        if body is not None and orelse is not None:
            return ()
        if body is not None or orelse is not None:
            return (_test(expr.test, body is not None), *(body if body is not None else orelse))
    return None


def conversion(outline: Outline, call: ast.Call, assigned: dict[str, ast.expr]):
    """The conditions under which ``call`` converts to float16 (``x.half()``,
    ``x.to(torch.float16)``, ``x.to(dtype=dtype)``); None for another call."""
    found = receiver(call)
    if found is None:
        return None
    if found[1] == "half" and not call.args and not call.keywords:
        return ()
    if found[1] != "to":
        return None
    given = [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]
    return next((w for a in given if (w := _float16_when(outline, a, assigned)) is not None), None)


def keeps_dtype(outline: Outline, call: ast.Call) -> bool:
    """A method that returns the module it is called on, in its dtype: ``.cuda()``,
    ``.eval()``, ``.to("cuda")``, ``.to(torch.device(...))``."""
    found = receiver(call)
    if found is None or found[1] not in _SAME_MODULE:
        return False
    given = [*call.args, *(k.value for k in call.keywords if k.arg != "non_blocking")]
    return found[1] != "to" or all(isinstance(a, ast.Constant) and isinstance(a.value, str) or isinstance(a, ast.Call)
                                   and outline.qualified_names(a.func) & {"torch.device"} for a in given)


def _texts(expr: ast.AST) -> list[str]:
    """The names, attributes and string keys in a saved object."""
    return [node.value if isinstance(node, ast.Constant) else node.id if isinstance(node, ast.Name) else node.attr
            for node in walk(expr) if isinstance(node, (ast.Name, ast.Attribute))
            or (isinstance(node, ast.Constant) and isinstance(node.value, str))]


def _names_optimizer(expr: ast.AST) -> bool:
    return any(named_like_optimizer(text) for text in _texts(expr))


def _names_scaler(expr: ast.AST) -> bool:
    return any("scaler" in text.lower() for text in _texts(expr))


def _order(node: ast.AST) -> tuple[int, int, int, int]:
    """Source order, an outer node before the nodes inside it."""
    return node.lineno, node.col_offset, -node.end_lineno, -node.end_col_offset


def _bind(found: dict[str, list], node: ast.AST, target: ast.expr, value: ast.expr | None) -> None:
    """Record ``node`` as a binding of each name in ``target`` (unpacked: no value)."""
    if isinstance(target, ast.Name):
        found.setdefault(target.id, []).append((node, value))
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            _bind(found, node, element, None)
    elif isinstance(target, ast.Starred):
        _bind(found, node, target.value, None)


def _body(function: ast.AST):
    """The nodes of a function's own code: not those of a function, lambda or class it defines
    (they run only when called)."""
    stack = list(child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(child_nodes(node))


@dataclass
class _Scope:
    """A function's (or a module's top level's) own code, read once: its nodes, how often each
    name is bound, the values plain assignments bind to it, the names bound otherwise too (a
    parameter, an import, ``global``, a definition, ``except ... as``), and what each name is
    built from (``_Module._builds``), filled as asked."""
    nodes: list[ast.AST]
    ids: set[int]
    stores: Counter
    assigned: dict[str, list[ast.expr]] = field(default_factory=dict)
    other: set[str] = field(default_factory=set)
    built: dict[str, tuple | None] = field(default_factory=dict)
    bound: dict[str, list[tuple[str, ast.expr]]] | None = None  # ``_Module.bindings``, once asked
    placed: dict[str, list[tuple[ast.AST, ast.expr | None]]] | None = None  # ``_Module.value_before``


class _Module:
    """One module's functions and what each does by its own code, with the calls it makes to
    functions this module can locate."""

    def __init__(self, path: Path, outline: Outline, root: Path | None):
        self.path, self.outline, self.root = path, outline, root
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[int, str] = {}  # function id -> its class's name
        self.class_defs: dict[str, ast.ClassDef] = {}
        for stmt in outline.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                self.class_defs[stmt.name] = stmt
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

    def function_at(self, row: int) -> ast.AST | None:
        """The innermost function of ``functions`` around line ``row`` (methods in a class body)."""
        return max((f for f in self.functions.values() if f.lineno <= row <= f.end_lineno),
                   key=lambda f: f.lineno, default=None)

    def callee(self, function: ast.AST | None, call: ast.Call) -> tuple[Path, str, tuple[Path, ...]] | None:
        """The module and name of the project function ``call`` (in ``function``) runs, and the
        other modules read to find it (a class and its bases)."""
        func = call.func
        if isinstance(func, ast.Name) and func.id in self.functions:
            return self.path, func.id, ()
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            cls = self.classes.get(id(function))
            if cls in self.class_defs:  # the class's own method, else a base's
                return self.method(cls, func.attr, ())
            qualified = f"{cls}.{func.attr}"
            return (self.path, qualified, ()) if cls is not None and qualified in self.functions else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id not in self.imported:
            built = self._built(function, func.value.id, call)
            return built[0].method(built[1], func.attr, built[2]) if built is not None else None
        return self._located(func)

    def _located(self, func: ast.expr) -> tuple[Path, str, tuple[Path, ...]] | None:
        """Where another module of the project defines what ``func`` names through an import:
        ``save`` (``from .utils import save``), ``utils.save`` (``import utils``, or ``from pkg
        import utils``, a submodule)."""
        if isinstance(func, ast.Name):
            found = self.imported.get(func.id)
            if found is None or found[2] is None:
                return None
            module, level, name = found
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.imported:
            module, level, name = self.imported[func.value.id]
            module, name = (module if name is None else (f"{module}.{name}" if module else name)), func.attr
        else:
            return None
        if self.root is None or not (module or level):
            return None
        path = project_module(self.root, self.path, module, level)
        return (path, name, ()) if path is not None and path.resolve() != self.path.resolve() else None

    def _class(self, expr: ast.expr) -> tuple[_Module, str, tuple[Path, ...]] | None:
        """The project class ``expr`` names (``Net``, ``models.Net``): its module, name, and the
        other modules read to find it."""
        if isinstance(expr, ast.Name) and expr.id in self.class_defs:
            return self, expr.id, ()
        found = self._located(expr)
        other = _module(found[0], module_text(found[0]), self.root) if found is not None else None
        return (other, found[1], (found[0],)) if other is not None and found[1] in other.class_defs else None

    def method(self, class_name: str, method: str, read: tuple[Path, ...]) -> tuple[Path, str, tuple[Path, ...]] | None:
        """The method Python runs for ``method`` of an instance of ``class_name`` (this module's):
        the class's own, else its bases', in ``classes.bases_in_order``. None where a base
        another library defines (or none) comes first, or the order is not Python's."""
        for module, cls in bases_in_order(self, self.class_defs[class_name], _Module._class_node):
            if module is not self:
                read += (module.path,)
            if f"{cls.name}.{method}" in module.functions:
                return module.path, f"{cls.name}.{method}", read
        return None

    def _class_node(self, expr: ast.expr) -> "tuple[_Module, ast.ClassDef] | None":
        found = self._class(expr)
        return (found[0], found[0].class_defs[found[1]]) if found is not None else None

    def _built(self, function: ast.AST | None, name: str, call: ast.Call) -> tuple | None:
        """The project class of the object ``name`` holds where ``call`` (in ``function``, or
        the top level) reads it: every binding of the name there (or at the top level, where
        the function binds none) builds it (``name = Net(...)``, ``name = Net(...).cuda()``),
        and nothing else binds it."""
        scope = function if function is not None else self.outline.tree
        if id(call) not in self._scope(scope).ids:  # in a function nested in it
            return None
        found = self._builds(scope, name)
        if found == () and scope is not self.outline.tree:
            found = self._builds(self.outline.tree, name)
        return found or None

    def _scope(self, scope: ast.AST) -> _Scope:
        cache = self.__dict__.setdefault("_scopes", {})
        if id(scope) not in cache:
            nodes = list(_body(scope))
            found = _Scope(nodes, {id(n) for n in nodes},
                           Counter(n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)))
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.other |= {a.arg for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs,
                                                scope.args.vararg, scope.args.kwarg) if a is not None}
            else:  # a function's `global name` binds the top level's
                found.other |= {name for n in self.outline.nodes(ast.Global) for name in n.names}
            for node in nodes:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    found.assigned.setdefault(node.targets[0].id, []).append(node.value)
                elif isinstance(node, (ast.Global, ast.Nonlocal)):
                    found.other.update(node.names)
                elif isinstance(node, ast.alias):
                    found.other.add(node.asname or node.name.split(".")[0])
                elif isinstance(node, (*_NESTED, ast.ExceptHandler)) and getattr(node, "name", None):
                    found.other.add(node.name)
            cache[id(scope)] = found
        return cache[id(scope)]

    def _builds(self, scope: ast.AST, name: str) -> tuple | None:
        """The class ``name`` is built from in ``scope`` (``_built``): its module, name, the
        other modules read; ``()`` where the scope binds no such name, None where it is bound
        otherwise too, or to something else."""
        known = self._scope(scope)
        built = known.built
        if name not in built:
            values = known.assigned.get(name, [])
            classes = []
            for value in values:
                while isinstance(value, ast.Call) and (found := receiver(value)) is not None \
                        and found[1] in _SAME_MODULE and isinstance(found[0], ast.Call):
                    value = found[0]
                classes.append(self._class(value.func) if isinstance(value, ast.Call) else None)
            if name in known.other or known.stores[name] != len(values) or None in classes \
                    or len({c[:2] for c in classes}) > 1:
                built[name] = None
            else:
                built[name] = (classes[0][0], classes[0][1], tuple(p for c in classes for p in c[2])) if classes else ()
        return built[name]

    def scope_nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of a function's own code (or the top level's): not those of a function,
        lambda or class it defines."""
        return self._scope(scope).nodes

    def assigned_once(self, scope: ast.AST) -> dict[str, ast.expr]:
        """The names of a function (or the module's top level) that one plain assignment binds
        and nothing else: each stands for its value."""
        known = self._scope(scope)
        return {name: values[0] for name, values in known.assigned.items()
                if len(values) == 1 and known.stores[name] == 1}

    def bindings(self, scope: ast.AST) -> dict[str, list[tuple[str, ast.expr]]]:
        """What each name of a function (or the top level) is bound to, in its own code: the
        value of an assignment (``"value"``), the iterable of a ``for`` loop that binds it
        (``"item of"``), and what ``name.append(...)`` (``extend``, ``add``, ``update``)
        collects into it (``"collects"``)."""
        known = self._scope(scope)
        if known.bound is None:
            found: dict[str, list[tuple[str, ast.expr]]] = {}
            for node in known.nodes:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            found.setdefault(target.id, []).append(("value", node.value))
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    for target in walk(node.target):
                        if isinstance(target, ast.Name):
                            found.setdefault(target.id, []).append(("item of", node.iter))
                elif isinstance(node, ast.Call) and (got := receiver(node)) is not None \
                        and got[1] in _COLLECTING and isinstance(got[0], ast.Name):
                    found.setdefault(got[0].id, []).extend(
                        ("collects", arg) for arg in (*node.args, *(k.value for k in node.keywords)))
            known.bound = found
        return known.bound

    def value_before(self, scope: ast.AST, name: ast.Name) -> ast.expr | None:
        """The value ``name`` holds where ``scope`` (a function, or the top level) reads it,
        where a plain assignment earlier there shows it (``x = ...``, ``x: T = ...``, ``x :=
        ...``). None when there is none, when the last binding before the read is another kind
        (``x += ...``, a ``for`` or ``with`` target, unpacking, an import), or when a binding
        later in a loop around the read may reach it on the next iteration: each read has one
        answer or none."""
        bindings = self.placed(scope).get(name.id, ())
        at = _order(name)
        value = None
        for binding, bound in bindings:
            if _order(binding) >= at:
                break
            if not contains(binding, name):  # `x = x + 1` reads the binding before it
                value = bound
        if value is None:
            return None
        later = [b for b, _ in bindings if _order(b) > at]
        if later and any(isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and contains(loop, name)
                         and any(contains(loop, b) for b in later) for loop in self._scope(scope).nodes):
            return None
        return value

    def placed(self, scope: ast.AST) -> dict[str, list[tuple[ast.AST, ast.expr | None]]]:
        """Every binding of each name in ``scope``'s own code, in source order, with the value
        a plain assignment binds (else None)."""
        known = self._scope(scope)
        if known.placed is None:
            found: dict[str, list[tuple[ast.AST, ast.expr | None]]] = {}
            for node in known.nodes:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        _bind(found, node, target, node.value)
                elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    _bind(found, node, node.target, node.value)
                elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor)):
                    _bind(found, node, node.target, None)
                elif isinstance(node, ast.comprehension):  # which has no position of its own
                    _bind(found, node.target, node.target, None)
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    _bind(found, node.optional_vars, node.optional_vars, None)
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    found.setdefault(node.name, []).append((node, None))
                elif isinstance(node, ast.alias):
                    found.setdefault(node.asname or node.name.split(".")[0], []).append((node, None))
            known.placed = {k: sorted(v, key=lambda b: _order(b[0])) for k, v in found.items()}
        return known.placed

    def rebinds(self, function: ast.AST, name: str) -> bool:
        """Whether ``function``'s own code binds ``name`` (a parameter rebound, say)."""
        return bool(self._scope(function).stores[name])

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
        args = function.args
        params = tuple(a.arg for a in named_parameters(args))
        defaults = {a.arg: ast.unparse(d) for a, d in parameter_defaults(args).items()}
        known = self._scope(function)
        body, stores, assigned = known.nodes, known.stores, known.assigned
        guards = guards_of(function)
        once = self.assigned_once(function)
        backwards, checkpoints, calls, conversions = [], [], [], []
        scales = steps = False
        for node in body:
            if isinstance(node, ast.For):
                conversions += self._parameters_converted(node, once, guards)
            if not isinstance(node, ast.Call):
                continue
            received = receiver(node)
            if received is not None and received[1] == "scale" and node.args:
                scales = True
            steps = steps or steps_optimizer(node)
            if is_backward(outline, node):
                scaled = received is not None and isinstance(received[0], ast.Call) \
                    and (receiver(received[0]) or (None, ""))[1] == "scale"
                backwards.append((self._place(node, ast.unparse(node)), scaled))
            elif framework_backward(node):  # the framework scales it where its precision needs
                backwards.append((self._place(node, ast.unparse(node)), True))
                steps = steps or received[1] == "update_params"
            elif outline.qualified_names(node.func) & _SAVE and node.args:
                parts, from_caller = self._saved_parts(function, node.args[0], params)
                checkpoints.append((self._place(node, ast.unparse(node)), any(map(_names_optimizer, parts)),
                                    any(map(_names_scaler, parts)), from_caller))
            elif (when := conversion(outline, node, once)) is not None and (root := _module_root(received[0])):
                conversions.append((root, self._place(node, ast.unparse(node), (*guards[id(node)], *when))))
            callee = self.callee(function, node)
            if callee is not None:
                calls.append((node, callee, guards[id(node)]))
        called = {id(c[0]) for c in calls}
        returns = [self._returned(n.value, once, assigned, stores, called) if n.value is not None else (None, None)
                   for n in sorted((n for n in body if isinstance(n, ast.Return)), key=lambda n: n.lineno)]
        return {"params": params, "backwards": backwards, "scales": scales, "steps": steps, "checkpoints": checkpoints,
                "converted": sorted(conversions, key=lambda c: c[1].row), "returns": returns, "calls": calls,
                "fixed": tuple((p, defaults.get(p)) for p in params if not stores[p]), "row": function.lineno}

    def _parameters_converted(self, loop: ast.For, once: dict[str, ast.expr], guards: dict) -> list[tuple[str, Place]]:
        """``for p in net.parameters(): p.data = p.data.half()`` converts ``net``: each
        parameter, the loop's body converting it on every turn."""
        found = receiver(loop.iter) if isinstance(loop.iter, ast.Call) else None
        owner = _module_root(found[0]) if found is not None and found[1] == "parameters" else None
        if owner is None or not isinstance(loop.target, ast.Name):
            return []
        for stmt in loop.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            if isinstance(target, ast.Attribute) and target.attr == "data" and _root_name(target) == loop.target.id \
                    and isinstance(stmt.value, ast.Call) and _root_name(stmt.value.func) == loop.target.id \
                    and (when := conversion(self.outline, stmt.value, once)) is not None:
                return [(owner, self._place(stmt, ast.unparse(stmt), (*guards[id(loop)], *when)))]
        return []

    def _returned(self, value: ast.expr, once: dict, assigned: dict, stores: Counter, called: set[int]):
        """What a ``return`` gives back, for ``returns_half``: (the name it returns, or None;
        what the value is made by — a conversion's ``Place`` or a project call — or None where
        something else may make it)."""
        while isinstance(value, ast.Call) and keeps_dtype(self.outline, value):
            value = value.func.value

        def made_by(expr: ast.expr) -> Place | ast.Call | None:
            while isinstance(expr, ast.Call) and keeps_dtype(self.outline, expr):
                expr = expr.func.value
            if not isinstance(expr, ast.Call):
                return None
            when = conversion(self.outline, expr, once)
            return self._place(expr, ast.unparse(expr), when) if when is not None else \
                expr if id(expr) in called else None

        if not isinstance(value, ast.Name):
            return None, ((made,) if (made := made_by(value)) is not None else None)
        values = assigned.get(value.id, [])
        made = [made_by(v) for v in values]
        return value.id, (tuple(made) if values and stores[value.id] == len(values) and None not in made else None)

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

    def _place(self, node: ast.AST, code: str, when: tuple[tuple[str, bool], ...] = ()) -> Place:
        return Place(self.path, node.lineno, code if len(code) <= 60 else code[:57] + "...", when=when)


_MODULES: ModulesByText[_Module] = ModulesByText(256)


def _module(path: Path, text: str | None, root: Path | None) -> _Module | None:
    if text is None:
        return None
    return _MODULES.get(path.resolve(), text, lambda outline: _Module(path, outline, root))


def _summary(module: _Module, qualified: str, depth: int, seen: set, read: set[Path]) -> Summary | None:
    facts = module.facts(qualified)
    if facts is None:
        return None
    own_place = Place(module.path, facts["row"], f"def {qualified.rsplit('.', 1)[-1]}")
    backwards = list(facts["backwards"])
    checkpoints = [Checkpoint(*c) for c in facts["checkpoints"]]
    converted = list(facts["converted"])
    scales, steps = facts["scales"], facts["steps"]
    returned: dict[int, Place | None] = {}  # a call's result: the float16 model its callee returns
    key = (module.path.resolve(), qualified)
    if depth > 0 and key not in seen:
        seen = seen | {key}
        for call, (path, name, consulted), guards in facts["calls"]:
            other = module if path == module.path else _module(path, module_text(path), module.root)
            if other is None:
                continue
            read.update(p for p in (path, *consulted) if p != module.path)
            inner = _summary(other, name, depth - 1, seen, read)
            if inner is None:
                continue
            via = name.rsplit(".", 1)[-1]
            backwards += [(replace(p, via=(via, *p.via)), s) for p, s in inner.backwards]
            checkpoints += [replace(c, place=replace(c.place, via=(via, *c.place.via))) for c in inner.checkpoints]
            scales = scales or inner.scales
            steps = steps or inner.steps
            passed = _passed(call, inner)
            if passed is None:
                continue
            for param, place in inner.halves:
                if passed.get(param, "").isidentifier() and (found := _seen_from(place, inner, passed, guards)):
                    converted.append((passed[param], replace(found, via=(via, *found.via))))
            if inner.returns_half is not None:
                found = _seen_from(inner.returns_half, inner, passed, ())
                returned[id(call)] = replace(found, via=(via, *found.via)) if found is not None else None
    first = {}
    for name, place in converted:
        first.setdefault(name, place)
    halves = tuple((name, place) for name, place in first.items() if name in facts["params"])
    return Summary(qualified, own_place, facts["params"], tuple(backwards), scales, tuple(checkpoints),
                   halves, _returns_half(facts["returns"], first, returned), facts["fixed"], steps)


def _returns_half(returns: list, converted: dict[str, Place], returned: dict[int, Place | None]) -> Place | None:
    """The first conversion behind a function's returns where each returns a model it made
    float16: one it converted (a name it converts in place, ``net.half()``), or that a callee
    returns so; under the conditions of them all. None where one may return something else."""
    places = []
    for name, made in returns:
        if name in converted:
            places.append(converted[name])
        elif made is None:
            return None
        else:
            places += [m if isinstance(m, Place) else returned.get(id(m)) for m in made]
    if not places or None in places:
        return None
    # What each return's conversion depends on, all together: no return is half where one fails.
    when = tuple(dict.fromkeys(c for place in places for c in place.when))
    return replace(places[0], when=when)


def _passed(call: ast.Call, callee: Summary) -> dict[str, str] | None:
    """What ``call`` passes for each of the callee's parameters, as code (the receiver for a
    method's ``self``); None where ``*args`` or ``**kwargs`` hide which."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    params = callee.params
    method = "." in callee.name and params[:1] == ("self",) and isinstance(call.func, ast.Attribute)
    found = {"self": ast.unparse(call.func.value)} if method else {}
    found.update((param, ast.unparse(arg)) for param, arg in zip(params[method:], call.args))
    found.update((k.arg, ast.unparse(k.value)) for k in call.keywords if k.arg in params)
    return found


def _seen_from(place: Place, callee: Summary, passed: dict[str, str], guards: tuple) -> Place | None:
    """``place`` in ``callee`` as a call of it sees it: under the call's own conditions
    (``guards``), the callee's parameters in its conditions replaced by what the call passes,
    or their defaults; None where a condition is then false (``mode == "export"`` for
    ``mode="train"``)."""
    when = list(guards)
    fixed = {name: passed.get(name, default) for name, default in callee.defaults}
    for code, holds in place.when:
        test = ast.parse(code, mode="eval").body
        names = {n.id for n in walk(test) if isinstance(n, ast.Name)} & {k for k, v in fixed.items() if v}
        if names:
            try:
                test = _Substitute({n: ast.parse(fixed[n].strip(), mode="eval").body for n in names}).visit(test)
                if bool(_constant(test)) != holds:
                    return None
                continue
            except SyntaxError:  # what the caller passes, spelled over lines with a comment
                pass
            except ValueError:
                code = ast.unparse(test)
        when.append((code, holds))
    return replace(place, when=tuple(when))


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.values.get(node.id, node)


_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _constant(test: ast.expr):
    """The value of a condition made of literals (compared, negated, joined by ``and``/``or``);
    ValueError for anything else."""
    if isinstance(test, ast.Constant):
        return test.value
    if isinstance(test, (ast.Tuple, ast.List, ast.Set)):
        return tuple(_constant(e) for e in test.elts)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not _constant(test.operand)
    if isinstance(test, ast.BoolOp):
        values = [bool(_constant(v)) for v in test.values]
        return all(values) if isinstance(test.op, ast.And) else any(values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE:
        try:
            return _COMPARE[type(test.ops[0])](_constant(test.left), _constant(test.comparators[0]))
        except TypeError:  # `"a" in 1`
            raise ValueError from None
    raise ValueError


def callee_summary(ctx: "CheckedFile", call: ast.Call) -> Summary | None:
    """What the project function ``call`` runs does (None when the code does not show which
    function that is). The file's findings then depend on the text of each other module read."""
    module = checked_module(ctx)
    if module is None or len(dotted(call.func) or ()) not in (1, 2):
        return None
    callee = module.callee(module.function_at(call.lineno), call)
    if callee is None:
        return None
    path, name, consulted = callee
    other = module if path == module.path else _module(path, module_text(path), module.root)
    if other is None:
        return None
    found = _summary(other, name, CALL_DEPTH - 1, set(), set())
    root = ctx.project_root()
    if root is not None:
        # the callee's summary, and the modules consulted to find it (a class and its bases)
        if other is not module:
            ctx.dependencies.add(dependency(f"summary:{project_name(path.resolve(), root.resolve())}:{name}", root))
        ctx.dependencies.update(module_dependency(root, p) for p in consulted if p != module.path)
    return found


def checked_module(ctx: "CheckedFile") -> _Module | None:
    """The checked file's own module, from the tree of the outline its check read already
    (a new ``Outline`` of its tree: what a name stands for must not take the project's star
    imports that the check's outline was given); kept with the check, not among the project's
    modules, since an editor's document is another text after each edit."""
    if "_summary_module" not in ctx.__dict__:
        ctx.__dict__["_summary_module"] = _Module(Path(ctx.path), ctx.outline.of_same_tree(), ctx.project_root())
    return ctx.__dict__["_summary_module"]


def _summary_of(root: Path, where: str) -> object:
    """A function's summary as a cached result depends on it (``summary:<path>:<name>``): an
    edit of its module that leaves what it does alone checks none of its callers again."""
    shown, name = where.rsplit(":", 1)
    path = root.resolve() / shown
    module = _module(path, module_text(path), root)
    found = _summary(module, name, CALL_DEPTH - 1, set(), set()) if module is not None else None

    def stable(value):  # paths from the root, however the module was first reached
        if isinstance(value, Path):
            return project_name(value.resolve(), root.resolve())
        if isinstance(value, (tuple, list)):
            return [stable(v) for v in value]
        if hasattr(value, "__dataclass_fields__"):
            return {f: stable(getattr(value, f)) for f in value.__dataclass_fields__}
        return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)

    return stable(found)


summarized_by("summary", _summary_of)


def made_half(ctx: "AstContext", call: ast.Call) -> list[MadeHalf]:
    """The models the project function ``call`` runs makes float16 (``callee_summary``): each
    argument it converts as a whole, as the caller spells it (the receiver, for a method's
    ``self``), and its result where every ``return`` gives back a model it made float16."""
    summary = callee_summary(ctx, call)
    if summary is None or not (summary.halves or summary.returns_half) \
            or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return []
    method = "." in summary.name and summary.params[:1] == ("self",) and isinstance(call.func, ast.Attribute)
    params = summary.params[method:]
    passed = {param: ctx.code(arg) for param, arg in zip(params, call.args)}
    passed.update((k.arg, ctx.code(k.value)) for k in call.keywords)
    if method:
        passed["self"] = ctx.code(call.func.value)
    found = [MadeHalf(passed[param], seen) for param, place in summary.halves
             if param in passed and (seen := _seen_from(place, summary, passed, ())) is not None]
    if summary.returns_half is not None and (seen := _seen_from(summary.returns_half, summary, passed, ())):
        found.append(MadeHalf(None, seen))
    return found

