"""Tiny epsilons on Python's ``ast``, and what they guard: a float literal below float16's
smallest subnormal (2**-24) and the names bound to one (a parameter's default the function
never rebinds, the one assignment a function makes, a module constant); the guard that holds
one (``x + eps``, ``x.clamp(min=eps)``, ``torch.clamp(x, min=eps)``) and the division, log or
root the guard protects; and the slice of a function a value is computed from (through the
names the function's assignments bind, not into an index or a tensor's metadata), with what
is on the way: a cast to a dtype the caller's tensor does not set, an op whose float16 result
is exactly 0 on ordinary input (a norm, a probability), a condition that tests the value
first. Names resolve through imports with Python's scoping (``ast_names``)."""

from __future__ import annotations

import ast
import io
import tokenize
from bisect import bisect_left
from functools import cached_property
from typing import Iterator

from .ast_context import AstContext
from .ast_names import file_resolver
from .names import DTYPES
from .outline import child_nodes, contains, parameter_defaults, walk
from .regions import value_before
from .summaries import conversion

# float16's smallest subnormal is 2**-24; anything below half of it rounds to 0.
FP16_SMALLEST = 2.0 ** -24
_CLAMPS = frozenset({"clamp", "clamp_min", "clip", "clamp_", "clamp_min_"})
# Ops that are inf or NaN at 0: what a tiny epsilon is there to guard.
_SINGULAR = frozenset({"log", "log2", "log10", "sqrt", "rsqrt", "reciprocal"})
_NORMS = frozenset({"norm", "vector_norm", "matrix_norm"})
_PROBABILITIES = frozenset({"sigmoid", "softmax"})
_METADATA = frozenset({"shape", "ndim", "dtype", "device", "size", "dim", "numel"})
_WIDE = frozenset({"float32", "float64"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

Function = ast.FunctionDef | ast.AsyncFunctionDef


def tiny_value(node: ast.AST | None) -> float | None:
    """The value of a float literal below ``FP16_SMALLEST``; None for anything else."""
    if type(node) is ast.Constant and type(node.value) is float and 0 < node.value < FP16_SMALLEST:
        return node.value
    return None


class Epsilons:
    """The tiny epsilons of one file: its tiny literals (``literals``), and the names that may
    hold one (``names``) and where they occur (``references``), in source order. ``of`` says which
    of them is one and where its value is written."""

    def __init__(self, ctx: AstContext):
        self._ctx = ctx
        outline = ctx.outline
        self.literals = sorted((c for c in outline.nodes(ast.Constant)
                                if type(c.value) is float and 0 < c.value < FP16_SMALLEST), key=ctx.order)
        self.names: frozenset[str] = frozenset()
        self.references: list[ast.Name] = []
        self._assigned: dict[str, list[ast.Assign]] = {}
        self._otherwise: dict[str, list[ast.stmt]] = {}  # `name += ...`, `name: T = ...`
        if not self.literals:
            return
        tiny = {id(c) for c in self.literals}
        names = {a.arg for f in outline.nodes(ast.arguments) for a, d in parameter_defaults(f).items() if id(d) in tiny}
        names.update(t.id for a in outline.nodes(ast.Assign) if id(a.value) in tiny
                     for t in a.targets if type(t) is ast.Name)
        names.update(a.target.id for a in outline.nodes(ast.AnnAssign)
                     if id(a.value) in tiny and type(a.target) is ast.Name)
        self.names = frozenset(names)
        if not names:
            return
        for a in outline.nodes(ast.Assign):
            for name in {t.id for t in a.targets if type(t) is ast.Name} & names:
                self._assigned.setdefault(name, []).append(a)
        for assigned in self._assigned.values():
            assigned.sort(key=ctx.order)
        for kind in (ast.AugAssign, ast.AnnAssign):
            for a in outline.nodes(kind):
                if type(a.target) is ast.Name and a.target.id in names:
                    self._otherwise.setdefault(a.target.id, []).append(a)
        self.references = sorted((n for n in outline.nodes(ast.Name) if n.id in names), key=ctx.order)

    def of(self, node: ast.AST) -> tuple[float, ast.AST] | None:
        """The value of the tiny epsilon ``node`` is, and where it is written: a literal (itself),
        a parameter's default the function does not rebind (the parameter), the one plain
        assignment the function (nested ones included) makes to the name and nothing else
        binds (its value), else a module constant bound once at the top level (its value)."""
        value = tiny_value(node)
        if value is not None:
            return value, node
        if type(node) is not ast.Name or node.id not in self.names:
            return None
        name = node.id
        function = self._ctx.enclosing_function(node)
        if function is not None:
            otherwise = any(contains(function, a) for a in self._otherwise.get(name, ()))
            local = [a for a in self._assigned.get(name, ()) if contains(function, a)]
            param = next((a for a in (*function.args.args, *function.args.kwonlyargs) if a.arg == name), None)
            if param is not None:
                default = parameter_defaults(function.args).get(param)
                value = tiny_value(default)
                return (value, param) if value is not None and not local and not otherwise else None
            if local:
                value = tiny_value(local[0].value) if len(local) == 1 and not otherwise else None
                return (value, local[0].value) if value is not None else None
        return self._constants.get(name)

    @cached_property
    def _constants(self) -> dict[str, tuple[float, ast.expr]]:
        """The names one statement of the top level binds to a tiny literal, and nothing else
        there: ``EPS = 1e-15``."""
        values: dict[str, list[ast.expr]] = {}
        for s in self._ctx.outline.tree.body:
            if type(s) is ast.Assign:
                for name in {t.id for t in s.targets if type(t) is ast.Name}:
                    values.setdefault(name, []).append(s.value)
            elif type(s) is ast.AnnAssign and type(s.target) is ast.Name and s.value is not None:
                values.setdefault(s.target.id, []).append(s.value)
        return {name: (tiny_value(v[0]), v[0]) for name, v in values.items() if len(v) == 1 and tiny_value(v[0])}


# -- arguments ---------------------------------------------------------------------------

def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if type(func) is ast.Attribute else func.id if type(func) is ast.Name else None


def _start(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _positional(call: ast.Call) -> list[ast.expr]:
    """The values of a call's arguments without a keyword, in order: ``*args``' and
    ``**kwargs``' too."""
    return [*(a.value if type(a) is ast.Starred else a for a in call.args),
            *(k.value for k in call.keywords if k.arg is None)]


def _first_argument(call: ast.Call) -> ast.AST | None:
    """The call's first argument in the source: an expression, a ``*`` or a keyword."""
    candidates = [*call.args[:1], *call.keywords[:1]]
    return min(candidates, key=_start) if candidates else None


def _argument(ctx: AstContext, node: ast.AST) -> tuple[ast.AST, ast.Call] | None:
    """The argument ``node`` is (itself, or the keyword or ``*`` around it), and its call."""
    parent = ctx.parent(node)
    argument = node if type(node) is ast.keyword else parent if type(parent) in (ast.keyword, ast.Starred) else node
    call = ctx.parent(argument)
    return (argument, call) if type(call) is ast.Call and argument is not call.func else None


def qualified_names(ctx: AstContext, node: ast.AST) -> set[str]:
    """What a name or attribute stands for through the file's imports, with Python's scoping."""
    return file_resolver(ctx, ctx.outline).qualified_names(node)


def references_to(ctx: AstContext, names: frozenset[str]) -> list[ast.expr]:
    """The names and attributes of the file that stand for one of ``names`` (``torch.finfo``;
    ``half`` after ``from torch import half``)."""
    resolver = file_resolver(ctx, ctx.outline)
    leading = resolver.names_leading_to(names)
    found = []
    for name in ctx.outline.nodes(ast.Name) if leading else ():
        node = name if name.id in leading else None
        while node is not None:
            if not names.isdisjoint(resolver.qualified_names(node)):
                found.append(node)
            parent = ctx.parent(node)
            node = parent if type(parent) is ast.Attribute and parent.value is node else None
    return found


# -- guards ------------------------------------------------------------------------------

def guard(ctx: AstContext, eps: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """(the guarded expression, the value it guards) for ``x + eps``, ``x.clamp(min=eps)``,
    ``x.clamp_min(eps)``, ``torch.clamp(x, min=eps)``, ``torch.clamp(x, eps)``."""
    parent = ctx.parent(eps)
    if type(parent) is ast.BinOp and type(parent.op) is ast.Add:
        return parent, parent.left if parent.right is eps else parent.right
    found = _argument(ctx, eps)
    if found is None:
        return None
    argument, call = found
    given = _positional(call)
    is_min = type(argument) is ast.keyword and argument.arg == "min"
    names = qualified_names(ctx, call.func)
    if any(n.startswith("torch.") and n.rsplit(".", 1)[-1] in _CLAMPS for n in names):
        if given and (is_min or len(given) > 1 and given[1] is eps):
            return call, given[0]
        return None
    func = call.func
    if type(func) is ast.Attribute and func.attr in _CLAMPS and not names \
            and (is_min or given and given[0] is eps):
        return call, func.value
    return None


def singular_use(ctx: AstContext, node: ast.AST) -> str | None:
    """The op at 0 that ``node`` feeds directly: a division by it, ``log(node)`` (its first
    argument; ``node`` may be a keyword, by its name), ``node.sqrt()``."""
    parent = ctx.parent(node)
    if type(parent) is ast.BinOp and type(parent.op) is ast.Div and parent.right is node:
        return "division"
    found = _argument(ctx, node)
    if found is not None:
        name = _called(found[1])
        return name if _first_argument(found[1]) is found[0] and name in _SINGULAR else None
    if type(parent) is ast.Attribute and parent.value is node and parent.attr in _SINGULAR:
        call = ctx.parent(parent)
        return parent.attr if type(call) is ast.Call and call.func is parent else None
    return None


def guarded_op(ctx: AstContext, guarded: ast.expr, function: Function) -> str | None:
    """What the guard protects: its direct use (``singular_use``), or the first such use later
    in ``function`` of a name it is assigned to (``norm = x.norm().clamp(min=eps)``;
    ``v / norm``)."""
    direct = singular_use(ctx, guarded)
    if direct is not None:
        return direct
    parent = ctx.parent(guarded)
    targets = parent.targets if type(parent) is ast.Assign else [parent.target] if type(parent) is ast.AnnAssign else []
    names = {t.id for t in targets if type(t) is ast.Name}
    if not names:
        return None
    at = ctx.order(guarded)
    for use in sorted((u for name in names for u in _uses(ctx).get(name, ())), key=ctx.order):
        if ctx.order(use) > at and contains(function, use):
            found = singular_use(ctx, use)
            if found is not None:
                return found
    return None


def _uses(ctx: AstContext) -> dict[str, list[ast.Name | ast.keyword]]:
    """Each name's reads and writes in the file, and the keywords of its name."""
    found = ctx.__dict__.get("_epsilon_uses")
    if found is None:
        found = ctx.__dict__["_epsilon_uses"] = {}
        for n in ctx.outline.nodes(ast.Name):
            found.setdefault(n.id, []).append(n)
        for k in ctx.outline.nodes(ast.keyword):
            if k.arg is not None:
                found.setdefault(k.arg, []).append(k)
    return found


def tested_positive(ctx: AstContext, eps: ast.AST, value: ast.expr, function: Function) -> bool:
    """The guard runs only where a condition compares the guarded value (``if norm > eps:``
    ``x / (norm + 1e-12)``; ``torch.where(theta > 0, x / (theta + 1e-10), y)``)."""
    names = set(_names_in(value))
    child, ancestor = eps, ctx.parent(eps)
    while ancestor is not None and ancestor is not function:
        test = ancestor.test if type(ancestor) in (ast.If, ast.IfExp, ast.While) else None
        if type(ancestor) is ast.Call and (ancestor.args or ancestor.keywords) \
                and "torch.where" in qualified_names(ctx, ancestor.func):
            first = _first_argument(ancestor)
            if child is not first:
                test = first.value if type(first) in (ast.keyword, ast.Starred) else first
        if test is not None and any(type(c) is ast.Compare and not names.isdisjoint(_names_in(c))
                                    for c in walk(test)):
            return True
        child, ancestor = ancestor, ctx.parent(ancestor)
    return False


# -- the slice a value is computed from --------------------------------------------------

def _names_in(node: ast.AST) -> list[str]:
    """The names in ``node``: of a variable, an attribute, a keyword, a parameter."""
    found = []
    for n in walk(node):
        kind = type(n)
        if kind is ast.Name:
            found.append(n.id)
        elif kind is ast.Attribute:
            found.append(n.attr)
        elif kind in (ast.keyword, ast.arg) and n.arg is not None:
            found.append(n.arg)
    return found


def _children(node: ast.AST) -> list:
    """``node``'s children in source order (a call's arguments and keywords merged, a dict's
    keys and values paired, an ``if`` expression's body before its test)."""
    kind = type(node)
    if kind is ast.Call:
        arguments = [*node.args, *node.keywords]
        if node.args and node.keywords:
            arguments.sort(key=_start)
        return [node.func, *arguments]
    if kind is ast.IfExp:
        return [node.body, node.test, node.orelse]
    if kind is ast.Dict:
        return [n for pair in zip(node.keys, node.values) for n in pair if n is not None]
    return list(child_nodes(node))


def _walk(root: ast.AST, data: bool = False) -> Iterator[ast.AST | str]:
    """``root`` and what is below it, the last child's subtree first; a name that is no node
    of its own (an attribute's, a keyword's, a parameter's) as a ``str`` where its node would
    be. With ``data``, only what a value is computed from: not an index (``logits[task_ids]``)
    nor a tensor's metadata (``x.shape``, ``x.size()``)."""
    stack: list = [root]
    while stack:
        node = stack.pop()
        yield node
        kind = type(node)
        if kind is str:
            continue
        if kind is ast.Attribute:
            if not (data and node.attr in _METADATA):
                stack += (node.value, node.attr)
        elif data and kind is ast.Call and type(node.func) is ast.Attribute and node.func.attr in _METADATA:
            continue
        elif data and kind is ast.Subscript:
            stack.append(node.value)
        elif kind is ast.keyword:
            stack += (node.arg, node.value) if node.arg is not None else (node.value,)
        elif kind is ast.arg:
            stack += (node.arg, node.annotation) if node.annotation is not None else (node.arg,)
        else:
            stack += _children(node)


def _name(node: ast.AST | str) -> str | None:
    return node if type(node) is str else node.id if type(node) is ast.Name else None


def bound_values(ctx: AstContext, function: Function) -> dict[str, list[ast.expr]]:
    """Every name in an assignment's targets in ``function`` (nested functions too: an
    attribute's, a subscript's names as well), with the values assigned, in source order."""
    cache = ctx.__dict__.setdefault("_bound_values", {})
    if id(function) not in cache:
        found: dict[str, list[ast.expr]] = {}
        assignments = [n for n in walk(function)
                       if type(n) is ast.Assign or type(n) is ast.AnnAssign and n.value is not None]
        assignments.sort(key=lambda n: (type(n) is ast.AnnAssign, ctx.order(n)))  # plain ones first
        for node in assignments:
            for target in node.targets if type(node) is ast.Assign else (node.target,):
                for name in _names_in(target):
                    found.setdefault(name, []).append(node.value)
        cache[id(function)] = found
    return cache[id(function)]


def computed_from(ctx: AstContext, value: ast.expr, function: Function) -> Iterator[ast.AST | str]:
    """What ``value`` is computed from (``walk`` with ``data``), following the names the
    function assigns into their values."""
    bound = bound_values(ctx, function)
    pending, seen = [value], set()
    while pending:
        for node in _walk(pending.pop(), data=True):
            yield node
            name = _name(node)
            if name is not None and name not in seen:
                seen.add(name)
                pending.extend(bound.get(name, ()))


def widens(ctx: AstContext, call: ast.Call, bound: dict[str, list[ast.expr]]) -> bool:
    """``x.float()``, ``x.double()``, ``x.to(torch.float32)``, ``x.to(work_dtype)`` (a name
    ``bound`` to an expression naming float32), ``x.to(self.store.dtype)`` or a
    ``dtype=torch.float32`` argument: the value is computed in a dtype the caller's input does
    not set."""
    func = call.func
    if type(func) is ast.Attribute:
        if func.attr in ("float", "double") and not call.args and not call.keywords:
            return True
        if func.attr in ("to", "type") and any(_fixed_dtype(ctx, a, bound) for a in (
                *_positional(call), *(k.value for k in call.keywords if k.arg == "dtype"))):
            return True
    return any(k.arg == "dtype" and _fixed_dtype(ctx, k.value, bound) for k in call.keywords)


def _fixed_dtype(ctx: AstContext, expr: ast.expr, bound: dict[str, list[ast.expr]]) -> bool:
    """float32/float64 named in the expression or in what the function assigns the name, or
    the dtype of something the object holds (``self.store.dtype``)."""
    if type(expr) is ast.Attribute and expr.attr == "dtype":
        root = expr.value
        while type(root) in (ast.Attribute, ast.Subscript):
            root = root.value
        return type(root) is ast.Name and root.id == "self"
    values = bound.get(expr.id, []) if type(expr) is ast.Name else []
    return any(DTYPES.get(n) in _WIDE for node in (expr, *values) for part in walk(node)
               if type(part) in (ast.Name, ast.Attribute) for n in qualified_names(ctx, part))


def zero_producer(ctx: AstContext, call: ast.Call) -> str | None:
    """'norm' or 'probability' for an op whose float16 result is exactly 0 on ordinary input:
    the norm of a zero (or tiny) vector, a sigmoid or softmax that saturates."""
    names = {n.rsplit(".", 1)[-1] for n in qualified_names(ctx, call.func) if n.startswith("torch.")}
    if not names and type(call.func) is ast.Attribute and not qualified_names(ctx, call.func):
        names = {call.func.attr}
    return "norm" if names & _NORMS else "probability" if names & _PROBABILITIES else None


def _module_outputs(ctx: AstContext, call: ast.Call, function: Function) -> list[ast.expr]:
    """For ``self.m(...)`` in a method, where the class stores an instance of a class of this
    file on ``.m``: what that class's ``forward`` returns."""
    func, params = call.func, function.args.args
    owner = ctx.parent(function)
    if not (type(func) is ast.Attribute and type(func.value) is ast.Name and params
            and func.value.id == params[0].arg) or type(owner) is not ast.ClassDef:
        return []
    cache = ctx.__dict__.setdefault("_module_outputs", {})
    if (id(owner), func.attr) not in cache:
        cache[(id(owner), func.attr)] = _stored_outputs(ctx, owner, func.attr)
    return cache[(id(owner), func.attr)]


def _stored_outputs(ctx: AstContext, owner: ast.ClassDef, attribute: str) -> list[ast.expr]:
    if "_classes" not in ctx.__dict__:
        ctx.__dict__["_classes"] = {c.name: c for c in sorted(ctx.outline.nodes(ast.ClassDef), key=ctx.order)}
    classes = ctx.__dict__["_classes"]
    found = []
    stored = [n for n in walk(owner) if type(n) is ast.Assign
              and any(type(t) is ast.Attribute and t.attr == attribute for t in n.targets)]
    for assign in sorted(stored, key=ctx.order):
        for made in _walk(assign.value):
            if type(made) is ast.Call and type(made.func) is ast.Name and made.func.id in classes:
                forward = next((m for m in classes[made.func.id].body
                                if isinstance(m, _FUNCTIONS) and m.name == "forward"), None)
                if forward is not None:
                    returns = sorted((r for r in walk(forward) if type(r) is ast.Return and r.value), key=ctx.order)
                    found.extend(r.value for r in returns)
    return found


def _model_output(ctx: AstContext, call: ast.Call, function: Function, bound: dict[str, list[ast.expr]]) -> bool:
    """Whether ``call``'s arguments come from a submodule or method of ``self``
    (``self.transformer(...)``), followed through the function's assignments."""
    params = function.args.args
    owner = params[0].arg if params else None
    if owner not in ("self", "cls"):
        return False
    pending, seen = [*_positional(call), *(k.value for k in call.keywords if k.arg is not None)], set()
    while pending:
        for node in _walk(pending.pop(), data=True):
            if type(node) is ast.Call:
                root = node.func
                while type(root) in (ast.Attribute, ast.Subscript, ast.Call):
                    root = root.func if type(root) is ast.Call else root.value
                if type(root) is ast.Name and root.id == owner:
                    return True
            name = _name(node)
            if name is not None and name not in seen:
                seen.add(name)
                pending.extend(bound.get(name, ()))
    return False


def _names_tensor(annotation: ast.expr) -> bool:
    """``Tensor`` in an annotation's text: a name, an attribute, a string (``Optional["torch.Tensor"]``)."""
    return any("Tensor" in (n.id if type(n) is ast.Name else n.attr if type(n) is ast.Attribute else n.value)
               for n in walk(annotation)
               if type(n) in (ast.Name, ast.Attribute) or type(n) is ast.Constant and type(n.value) is str)


def caller_zero(ctx: AstContext, value: ast.expr, function: Function) -> tuple[str, str] | None:
    """The ``Tensor``-annotated parameter of ``function`` whose dtype ``value`` keeps (the first
    in the signature: the data, not an index), and the op on the way that makes it exactly 0 in
    float16 ('norm', 'probability'; followed through the function's assignments and one level
    into this file's submodules; not the norm of a model's output, which is not 0 in practice).
    None when either is missing or the computation is widened on the way (``widens``)."""
    args = function.args
    tensors = [a.arg for a in (*args.args, *args.kwonlyargs)
               if a.annotation is not None and _names_tensor(a.annotation)]
    if not tensors:
        return None
    bound = bound_values(ctx, function)
    seen, zero = set(), None
    for node in computed_from(ctx, value, function):
        if type(node) is ast.Call:
            if widens(ctx, node, bound):
                return None
            made = zero_producer(ctx, node)
            if made == "norm" and _model_output(ctx, node, function, bound):
                made = None
            zero = zero or made or next(
                (z for out in _module_outputs(ctx, node, function) for c in _walk(out)
                 if type(c) is ast.Call and (z := zero_producer(ctx, c))), None)
        elif (name := _name(node)) is not None:
            seen.add(name)
    tensor = next((t for t in tensors if t in seen), None)
    return (tensor, zero) if tensor is not None and zero is not None else None


# -- float16 models ----------------------------------------------------------------------

def halved_classes(ctx: AstContext) -> dict[str, ast.Call]:
    """Classes of this file whose instances the file converts to float16 (``summaries.
    conversion``, whatever switch), with the first call that does it: ``Net(...).cuda().half()``,
    ``model = Net(...)``; ``model.to(torch.float16)``."""
    classes = {c.name for c in ctx.outline.nodes(ast.ClassDef)}
    found: dict[str, ast.Call] = {}
    if not classes:
        return found
    converting = [c for c in ctx.outline.nodes(ast.Call) if type(c.func) is ast.Attribute
                  and c.func.attr in ("half", "to") and conversion(ctx.outline, c, {}) == ()]
    for call in sorted(converting, key=ctx.order):
        made = call.func.value
        for _ in range(2):  # the instance, or the name it was assigned to
            while type(made) is ast.Call and type(made.func) is ast.Attribute:
                made = made.func.value  # .cuda(), .to(device), .eval()
            if type(made) is ast.Name and made.id not in classes:
                made = value_before(ctx, made)
        if type(made) is ast.Call and type(made.func) is ast.Name and made.func.id in classes:
            found.setdefault(made.func.id, call)
    return found


# -- text --------------------------------------------------------------------------------

def parenthesized_code(ctx: AstContext, node: ast.AST) -> str:
    """The node's code with the parentheses around it (``(1e-8)`` in ``x + (1e-8)``), not
    those of the call it is the argument of."""
    start, end = ctx.offsets(node)
    tokens = _statement_tokens(ctx, node)
    first = bisect_left(tokens, (start,))
    last = bisect_left(tokens, (end,)) - 1
    if first >= len(tokens) or tokens[first][0] != start or last < 0 or tokens[last][1] != end:
        return ctx.code(node)
    calls = set()
    parent = ctx.parent(node)
    while parent is not None:
        if type(parent) is ast.Call:
            calls.add(ctx.offsets(parent)[1])
        parent = ctx.parent(parent)
    while first > 0 and last + 1 < len(tokens) and tokens[first - 1][2] == "(" and tokens[last + 1][2] == ")" \
            and tokens[last + 1][1] not in calls:
        first, last = first - 1, last + 1
    return ctx.source[tokens[first][0]:tokens[last][1]]


def _statement_tokens(ctx: AstContext, node: ast.AST) -> list[tuple[int, int, str]]:
    """The tokens of the lines of the statement around ``node`` but comments and line breaks,
    as (start, end, text) offsets in the file; none where they do not tokenize."""
    statement = node if isinstance(node, ast.stmt) else ctx.enclosing(node, ast.stmt)
    if statement is None:
        return []
    first_row = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))])
    base = ctx.offset(first_row, 0)
    text = ctx.source[base:ctx.offset(statement.end_lineno + 1, 0)]
    starts = [base]
    for line in io.StringIO(text):  # the lines tokenize reads
        starts.append(starts[-1] + len(line))
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    try:
        return [(starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1], t.string)
                for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in skipped]
    except (tokenize.TokenError, SyntaxError):
        return []
