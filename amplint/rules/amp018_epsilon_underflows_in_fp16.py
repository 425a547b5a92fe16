from __future__ import annotations

import ast
import keyword
import re
from functools import lru_cache
from typing import NamedTuple

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Related
from ..engine.enabling import region_switch
from ..engine.crossfile import enabling_site, named_loss_place, named_loss_places_on_ast
from ..engine.outline import Outline, contains
from ..engine.region_tables import region_dtype, region_table
from ..engine.promotion import FP32_FAMILY, policies_of
from ..engine.rule import AnyOf, Invalid, Rule, TextTest, Valid
from ..engine.semantics import (
    DTYPES,
    assigned_before,
    reaching_region,
    call_spelling,
    calls_enabled_autocast,
    enclosing_function,
    inferred_dtype,
    method_call,
    subtree,
)
from ..engine.text_scan import enclosing_bracket, space_before, word_before
from ..engine.tree import children
from ..policy import PolicyError

# float16's smallest subnormal is 2**-24; anything below half of it rounds to 0.
FP16_SMALLEST = 2.0 ** -24
_EPS_KEYWORDS = frozenset({"eps", "epsilon", "min"})
_CLAMPS = frozenset({"clamp", "clamp_min", "clip", "clamp_", "clamp_min_"})
# Ops that are inf or NaN at 0: what a tiny epsilon is there to guard.
_SINGULAR = frozenset({"log", "log2", "log10", "sqrt", "rsqrt", "reciprocal"})
_WIDE = frozenset({"float32", "float64"})
_NORMS = frozenset({"norm", "vector_norm", "matrix_norm"})
_PROBABILITIES = frozenset({"sigmoid", "softmax"})
_ZERO_PRODUCERS = _NORMS | _PROBABILITIES
# Names a function that deals with float16 itself mentions (_handles_half).
_HALF_AWARE = frozenset({"torch.float16", "torch.half", "torch.finfo"})
_METADATA = frozenset({"shape", "ndim", "dtype", "device", "size", "dim", "numel"})
# Name parts of what a data loader gives (in float32, whatever autocast runs).
_GROUND_TRUTH = frozenset({"gt", "target", "targets", "label", "labels", "truth"})
# Methods whose result is a Python number or an integer count, not a float16 tensor.
_COUNTS = frozenset({"item", "size", "numel", "dim", "long", "int", "count_nonzero", "tolist"})


def _tiny_float(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float) and 0 < node.value < FP16_SMALLEST


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


class _TinyNames:
    """The names ``_epsilon`` reads as a tiny epsilon in a function (by id; 0 at module level):
    a parameter (not positional-only) with a tiny default the function never rebinds, else the
    one plain assignment of a tiny literal the function (nested ones included) makes to the
    name, else a module constant bound once at the top level. ``candidates``: the names that
    may be one somewhere."""

    def __init__(self, outline: Outline, tiny_constants: list[ast.Constant]):
        tiny = {id(c) for c in tiny_constants}
        module_values: dict[str, list[ast.expr]] = {}
        for a in outline.tree.body:
            if isinstance(a, ast.Assign):
                for name in {t.id for t in a.targets if isinstance(t, ast.Name)}:
                    module_values.setdefault(name, []).append(a.value)
            elif isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and a.value is not None:
                module_values.setdefault(a.target.id, []).append(a.value)
        self.module = frozenset(n for n, values in module_values.items() if len(values) == 1 and id(values[0]) in tiny)
        self.candidates = self.module | {t.id for a in outline.nodes(ast.Assign) if id(a.value) in tiny
                                         for t in a.targets if isinstance(t, ast.Name)}
        self.candidates |= {a.arg for f in outline.nodes(ast.arguments)
                            if any(id(d) in tiny for d in (*f.defaults, *f.kw_defaults))
                            for a in (*f.posonlyargs, *f.args, *f.kwonlyargs)}
        # Of the candidates: plain `name = ...` statements, and `name += ...`, `name: T (= ...)`.
        self._assigned: dict[str, list[ast.Assign]] = {}
        self._otherwise: dict[str, list[ast.stmt]] = {}
        if self.candidates:
            for a in outline.nodes(ast.Assign):
                for name in {t.id for t in a.targets if isinstance(t, ast.Name)} & self.candidates:
                    self._assigned.setdefault(name, []).append(a)
            for kind in (ast.AugAssign, ast.AnnAssign):
                for a in outline.nodes(kind):
                    if isinstance(a.target, ast.Name) and a.target.id in self.candidates:
                        self._otherwise.setdefault(a.target.id, []).append(a)
        self._functions = {id(f): f for kind in (ast.FunctionDef, ast.AsyncFunctionDef) for f in outline.nodes(kind)}
        self._found: dict[int, frozenset[str]] = {0: self.module}

    def __call__(self, scope: int) -> frozenset[str]:
        if scope not in self._found:
            self._found[scope] = frozenset(n for n in self.candidates if self._tiny_in(self._functions[scope], n))
        return self._found[scope]

    def _tiny_in(self, function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
        local = [a for a in self._assigned.get(name, ()) if contains(function, a)]
        otherwise = any(contains(function, a) for a in self._otherwise.get(name, ()))
        if any(a.arg == name for a in function.args.args + function.args.kwonlyargs):
            default = next((d for a, d in _parameter_defaults(function) if a.arg == name), None)
            return _tiny_float(default) and not local and not otherwise
        if local:
            return len(local) == 1 and _tiny_float(local[0].value) and not otherwise
        return name in self.module


def _parameter_defaults(function: ast.FunctionDef) -> list[tuple[ast.arg, ast.expr]]:
    """The parameters libcst lists as ``params`` and ``kwonly_params`` that have a default,
    with it."""
    positional = function.args.posonlyargs + function.args.args
    found = [(a, d) for a, d in zip(positional[::-1], function.args.defaults[::-1])
             if a in function.args.args]
    return found + [(a, d) for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None]


class _Guard(NamedTuple):
    """A tiny epsilon outside any region as check() may read it: the guard that holds it
    (``x + eps``, a clamp), the innermost function around it (``enclosing_function``) and what
    ``_guard`` may find the guard guards (two values where the clamp's spelling leaves open
    whether it is ``torch.clamp(x, ...)`` or ``x.clamp(...)``)."""
    epsilon: ast.expr
    guard: ast.expr
    function: ast.FunctionDef | ast.AsyncFunctionDef
    values: list[ast.expr]


def _guarded_epsilons(outline: Outline, tiny_constants: list[ast.Constant], tiny_in: _TinyNames) -> list[_Guard]:
    """The epsilons (a tiny literal, or a name ``tiny_in`` the guard's function) in a function
    whose guard ``_guarded_op`` may find guarding a division, log or root: the guard divides,
    is the first argument of a log or root, or is the receiver of one, or is assigned to a
    name used so later in the function."""
    tiny = {id(c) for c in tiny_constants}

    def may_be_tiny(node: ast.expr) -> bool:
        return id(node) in tiny or isinstance(node, ast.Name) and node.id in tiny_in.candidates

    found = [(side, b, [other]) for b in outline.nodes(ast.BinOp) if isinstance(b.op, ast.Add)
             for side, other in ((b.left, b.right), (b.right, b.left)) if may_be_tiny(side)]
    calls = outline.nodes(ast.Call)
    found += [(a, c, values) for c in calls if _called(c) in _CLAMPS or _torch_clamp(outline.qualified_names(c.func))
              for a in (*(s.value if isinstance(s, ast.Starred) else s for s in c.args), *(k.value for k in c.keywords))
              if may_be_tiny(a) and (values := _clamped_values(outline, c, a))]
    # enclosing_function: the innermost function around the guard (a decorator's too).
    functions = sorted((f for kind in (ast.FunctionDef, ast.AsyncFunctionDef) for f in outline.nodes(kind)),
                       key=lambda f: (f.lineno, f.col_offset))
    guards = []
    for eps, guard, values in found:
        function = next((f for f in reversed(functions) if contains(f, guard)), None)
        if function is not None and (id(eps) in tiny or eps.id in tiny_in(id(function))):
            guards.append(_Guard(eps, guard, function, values))
    if not guards:
        return []
    singular_calls = [c for c in calls if _called(c) in _SINGULAR]
    singular = [b.right for b in outline.nodes(ast.BinOp) if isinstance(b.op, ast.Div)]
    singular += [a for c in singular_calls for a in (*c.args[:1], *(k.value for k in c.keywords))]
    singular += [a.value for a in outline.nodes(ast.Attribute) if a.attr in _SINGULAR]
    taken_at_zero = {id(e) for e in singular}
    # Where each name is divided by, or its log or root taken (a keyword's name is a libcst
    # ``Name`` there too).
    uses: dict[str, list[ast.Name | ast.keyword]] = {}
    for e in singular:
        if isinstance(e, ast.Name):
            uses.setdefault(e.id, []).append(e)
    for k in (k for c in singular_calls for k in c.keywords if k.arg is not None):
        uses.setdefault(k.arg, []).append(k)
    assigned = {id(a.value): [t.id for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                              if isinstance(t, ast.Name)]
                for kind in (ast.Assign, ast.AnnAssign) for a in outline.nodes(kind) if a.value is not None}
    return [g for g in guards if id(g.guard) in taken_at_zero or any(
        (use.lineno, use.col_offset) > (g.guard.lineno, g.guard.col_offset) and contains(g.function, use)
        for name in assigned.get(id(g.guard), ()) for use in uses.get(name, ()))]


def _torch_clamp(names: frozenset[str]) -> bool:
    return any(q.startswith("torch.") and q.rsplit(".", 1)[-1] in _CLAMPS for q in names)


def _clamped_values(outline: Outline, call: ast.Call, eps: ast.expr) -> list[ast.expr]:
    """What ``_guard`` may find ``call`` guards with ``eps``: the first positional argument of
    a clamp that may be torch's (``eps`` its ``min=`` or second positional argument), the
    receiver of a clamp method that no import surely names (``eps`` its ``min=`` or first
    positional argument). libcst's positional arguments include ``*args`` and ``**kwargs``."""
    positional = [*(a.value if isinstance(a, ast.Starred) else a for a in call.args),
                  *(k.value for k in call.keywords if k.arg is None)]
    is_min = any(k.arg == "min" and k.value is eps for k in call.keywords)
    func = call.func
    values = []
    if _torch_clamp(outline.qualified_names(func)) and positional \
            and (is_min or len(positional) > 1 and positional[1] is eps):
        values.append(positional[0])
    if isinstance(func, ast.Attribute) and func.attr in _CLAMPS and not outline.surely_qualified_names(func) \
            and (is_min or positional and positional[0] is eps):
        values.append(func.value)
    return values


class _Slice:
    """``_slice`` on the ast: the nodes a guarded value is computed from, following the names
    the function's assignments bind (``bound``), not into an index or a tensor's metadata
    (``_data_walk``), visited as libcst visits them; and the names among them, libcst's
    ``Name`` nodes (an attribute's, a keyword's and a lambda parameter's too)."""

    def __init__(self, roots: list[ast.expr], bound: dict[str, list[ast.expr]]):
        self.nodes: list[ast.AST] = []
        self.names: set[str] = set()
        pending = list(roots)
        while pending:
            stack = [pending.pop()]
            while stack:
                node = stack.pop()
                self.nodes.append(node)
                if isinstance(node, ast.Attribute) and node.attr in _METADATA or isinstance(node, ast.Call) \
                        and isinstance(node.func, ast.Attribute) and node.func.attr in _METADATA:
                    continue
                if isinstance(node, ast.Subscript):
                    stack.append(node.value)
                    continue
                for name in _names_in(node, deep=False):
                    if name not in self.names:
                        self.names.add(name)
                        pending.extend(bound.get(name, ()))
                stack.extend(ast.iter_child_nodes(node))

    def calls(self) -> list[ast.Call]:
        return [n for n in self.nodes if isinstance(n, ast.Call)]


def _bound_values_on_ast(outline: Outline, function: ast.AST) -> dict[str, list[ast.expr]]:
    """``_bound_values``: every name in an assignment's targets in ``function`` (nested
    functions too), with the values assigned."""
    bound: dict[str, list[ast.expr]] = {}
    for kind in (ast.Assign, ast.AnnAssign):
        for a in outline.nodes(kind):
            if a.value is not None and contains(function, a):
                for target in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                    for name in _names_in(target):
                        bound.setdefault(name, []).append(a.value)
    return bound


_WIDE_DTYPES = frozenset(name for name, dtype in DTYPES.items() if dtype in _WIDE)


def _surely_widens(outline: Outline, call: ast.Call, bound: dict[str, list[ast.expr]]) -> bool:
    """``_widens`` where its imports surely name the dtype (``surely_qualified_names``): then
    check() drops the guarded value on every path outside regions."""
    func = call.func
    if isinstance(func, ast.Attribute):
        if func.attr in ("float", "double") and not call.args and not call.keywords:
            return True
        if func.attr in ("to", "type") and any(
                _surely_fixed_dtype(outline, a, bound) for a in (*call.args, *(k.value for k in call.keywords
                                                                              if k.arg == "dtype"))):
            return True
    return any(k.arg == "dtype" and _surely_fixed_dtype(outline, k.value, bound) for k in call.keywords)


def _surely_fixed_dtype(outline: Outline, expr: ast.expr, bound: dict[str, list[ast.expr]]) -> bool:
    """``_fixed_dtype``: the dtype of something ``self`` holds, or float32/float64 named in the
    expression or in what the function assigns the name."""
    if isinstance(expr, ast.Attribute) and expr.attr == "dtype":
        root = expr.value
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        return isinstance(root, ast.Name) and root.id == "self"
    values = bound.get(expr.id, []) if isinstance(expr, ast.Name) else []
    return any(isinstance(part, (ast.Name, ast.Attribute))
               and not outline.surely_qualified_names(part).isdisjoint(_WIDE_DTYPES)
               for node in (expr, *values) for part in ast.walk(node))


def _may_fire(outline: Outline) -> bool:
    """A float literal the rule would call tiny (libcst's ``Float`` nodes are the ``float``
    constants of Python's ast), in a file that enables autocast (a region around it or around a
    caller of its function); or an epsilon in a function that guards a division, log
    or root (``_guarded_epsilons``) of a value that no cast on its way surely widens
    (``_surely_widens``), inside a loss place by name in a project that enables float16
    autocast (the value not a count nor computed from the labels), or in a class of this file
    converted to float16, or in a public function (that does not name float16 itself) with a
    ``Tensor`` parameter the value is computed from together with a norm or probability."""
    tiny_constants = [c for c in outline.nodes(ast.Constant)
                      if type(c.value) is float and 0 < c.value < FP16_SMALLEST]
    if not tiny_constants:
        return False
    tiny_in = _TinyNames(outline, tiny_constants)
    # In a float16 region (_check_operand, _check_keyword): around the epsilon, or around a
    # call of its function in this file (``reaching_region``), so anywhere in a file that
    # enables autocast.
    if calls_enabled_autocast(outline):
        return True
    guards = _guarded_epsilons(outline, tiny_constants, tiny_in)
    bound_in: dict[int, dict[str, list[ast.expr]]] = {}
    # Every path outside regions reads the guarded value's slice and drops a widened one.
    guarded: list[tuple[_Guard, ast.expr, dict, _Slice]] = []
    for g in guards:
        if id(g.function) not in bound_in:
            bound_in[id(g.function)] = _bound_values_on_ast(outline, g.function)
        bound = bound_in[id(g.function)]
        for value in g.values:
            slice_ = _Slice([value], bound)
            if not any(_surely_widens(outline, c, bound) for c in slice_.calls()):
                guarded.append((g, value, bound, slice_))
    if not guarded:
        return False
    half_aware: dict[int, bool] = {}

    def handles_half(function: ast.AST) -> bool:  # _handles_half, where imports surely decide it
        if id(function) not in half_aware:
            half_aware[id(function)] = any(
                isinstance(n, (ast.Name, ast.Attribute)) and not outline.surely_qualified_names(n).isdisjoint(
                    _HALF_AWARE) for n in ast.walk(function))
        return half_aware[id(function)]

    calls = outline.nodes(ast.Call)
    # A class of this file whose instances it converts to float16 (_halved_classes; the dtype
    # named anyhow: the check resolves it).
    if any(contains(cls, g.epsilon) for cls in _may_be_halved_classes(outline, calls) for g, *_ in guarded):
        return True
    # Where a loss is computed, in a project that enables float16 autocast elsewhere
    # (_check_project_float16): not a count, not computed from the labels.
    if outline.project is not None and outline.project.path is not None:
        places = named_loss_places_on_ast(outline, outline.project.path)
        if any(any(contains(f, g.epsilon) for f in places) and not handles_half(g.function)
               and not _counts(value, bound) and _GROUND_TRUTH.isdisjoint(
                   part for name in slice_.names for part in name.lower().split("_"))
               for g, value, bound, slice_ in guarded) and outline.project.float16_autocast:
            return True
    # Else a public function with a ``Tensor`` parameter that guards a division, log or root
    # itself (_check_caller_dtype).
    if not any(_may_make_zero(outline, c) for c in calls):
        return False
    private_classes = [c for c in outline.nodes(ast.ClassDef) if c.name.startswith("_") and not c.name.endswith("__")]
    method_of = {id(m): c for c in outline.nodes(ast.ClassDef) for m in c.body}
    for g, _, bound, slice_ in guarded:
        f = g.function
        tensors = {a.arg for a in f.args.args + f.args.kwonlyargs
                   if a.annotation is not None and "Tensor" in ast.dump(a.annotation)}
        if (f.name.startswith("_") and not f.name.endswith("__")) or tensors.isdisjoint(slice_.names) \
                or any(contains(c, f) for c in private_classes):
            continue
        owner = f.args.args[0].arg if f.args.args else None
        submodules = _submodules_making_zero(outline, method_of[id(f)]) if id(f) in method_of else frozenset()
        if any(_may_make_zero(outline, c) and not _surely_model_output(outline, c, owner, bound)
               or isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
               and c.func.value.id == owner and c.func.attr in submodules
               for c in slice_.calls()) and not handles_half(f):
            return True
    return False


# `_guarded_epsilons` asked of the text, before anything is parsed: outside regions, the rule
# fires only on an epsilon that guards something, so a file whose tiny literals are neither
# added (`+`) nor clamped, directly or through a name they may be bound to, needs no ast.
# The fragments' marks of a tiny literal, one for every way to write a value below 2**-24
# (about 5.96e-8), as mantissa M times 10**E: an exponent E <= -8 (`1e-8`, `5E-0_9`); for
# -7 <= E <= -1, M < 1, so a fraction (`0.5e-7`, `.3e-7`); else M itself below 1e-7, with
# seven zeros after its point (`0.000_000_05`). Each starts with a literal, which the regex
# engine scans for; a number's point is `[.]`, which no space may follow (an attribute's
# `\.` may: the prefilter lets blanks around it).
_TINY = AnyOf(r"e-[0_]*(?:[89]|[1-9]_?\d)", r"E-[0_]*(?:[89]|[1-9]_?\d)",
              r"[.]\d[\d_]*[eE]-[0_]*[1-7](?![\d_])", r"[.]0(?:_?0){6}")
_TINY_MARKS = tuple(re.compile(p) for p in _TINY.patterns)
_EXPONENT = re.compile(r"[eE][-+]?\d(?:_?\d)*")
_CLAMP_ALIAS = re.compile(r"(?:clamp|clip)\w*\s+as\s+(\w+)")
_BOUND_BEFORE = re.compile(r"(\w+)[ \t]*(?==(?!=)|:)")


@lru_cache(maxsize=1)  # both fragment groups ask it of the same text
def _tiny_literals(text: str) -> tuple[tuple[int, int], ...]:
    """Where the float literals below ``FP16_SMALLEST`` stand (a literal that Python would
    not read as a number, in case: as one)."""
    found = []
    for mark in sorted((m for pattern in _TINY_MARKS for m in pattern.finditer(text)), key=lambda m: m.start()):
        if found and mark.start() < found[-1][1]:
            continue  # the literal another mark found
        start = mark.start()
        while start > 0 and (text[start - 1].isdigit() or text[start - 1] in "_."):
            start -= 1
        if start > 0 and (text[start - 1].isalpha() or text[start - 1] == "_"):
            continue  # part of a name
        end = mark.end()
        while end < len(text) and (text[end].isdigit() or text[end] == "_"):
            end += 1
        exponent = _EXPONENT.match(text, end)
        end = exponent.end() if exponent else end
        if end < len(text) and text[end] in "jJ":
            continue  # imaginary
        try:
            value = float(text[start:end].replace("_", ""))
        except ValueError:
            value = 0.5 * FP16_SMALLEST
        if 0 < value < FP16_SMALLEST:
            found.append((start, end))
    return tuple(found)


def _has_tiny(text: str) -> bool:
    return bool(_tiny_literals(text))


def _added_or_clamped(text: str, start: int, end: int, clamps: frozenset[str]) -> bool:
    """Whether the expression at ``start:end`` may be an operand of `+`, or an argument of a
    call by one of the ``clamps`` names; yes where unsure."""
    before = start
    while True:
        before = space_before(text, before)
        if before is None:
            return True
        if not before or text[before - 1] != "(":
            break
        before -= 1
    if before and text[before - 1] == "+":
        return True
    after = end
    while after < len(text) and text[after] in " \t\r\n\\)":
        after += 1
    if after < len(text) and text[after] in "+#":
        return True
    if not clamps:
        return False
    opening = start
    while True:  # out of parentheses that call nothing: `min=(eps)`
        opening = enclosing_bracket(text, opening)
        if opening is None:
            return True
        if opening < 0 or text[opening] != "(":
            return False
        name_end = space_before(text, opening)
        if name_end is None:
            return True
        name = text[word_before(text, name_end):name_end]
        if name and not keyword.iskeyword(name):
            return name in clamps


def _may_guard_tiny(text: str) -> bool:
    """``_guarded_epsilons`` loosely, on the text: a tiny literal added or clamped, or one that
    a name may be bound to (a name before `=` or `:` on its line, or on the five lines above
    when it starts its line: an assignment, a default, a keyword) that is added or clamped
    somewhere in the file."""
    # What a clamp may be called (`from torch import clamp as c`), if the file names one.
    clamps = _CLAMPS | frozenset(_CLAMP_ALIAS.findall(text)) if "clamp" in text or "clip" in text else frozenset()
    names = set()
    for start, end in _tiny_literals(text):
        if _added_or_clamped(text, start, end, clamps):
            return True
        line = text.rfind("\n", 0, start) + 1
        if not text[line:start].strip(" \t(\\"):  # it goes on a statement begun above: `eps = (`
            for _ in range(5):
                line = text.rfind("\n", 0, max(line - 1, 0)) + 1
        names.update(_BOUND_BEFORE.findall(text, line, start))
    return any(_added_or_clamped(text, use.start(), use.end(), clamps)
               for name in names for use in re.finditer(rf"{name}(?<![\w.]{name})(?!\w)", text))


def _counts(value: ast.expr, bound: dict[str, list[ast.expr]]) -> bool:
    """``number`` in _check_project_float16: an operand of the guarded value is a Python number
    (an integer, a size, a count, ``len(...)``) or a name the function assigns one."""
    def number(expr: ast.expr) -> bool:
        if isinstance(expr, ast.Constant):
            return type(expr.value) is int
        if isinstance(expr, (ast.Tuple, ast.List)):
            return bool(expr.elts) and all(number(e) for e in expr.elts)
        if isinstance(expr, ast.Call):
            return isinstance(expr.func, ast.Attribute) and expr.func.attr in _COUNTS \
                or isinstance(expr.func, ast.Name) and expr.func.id == "len"
        return False

    operands = [value.left, value.right] if isinstance(value, ast.BinOp) else [value]
    return any(number(o) or isinstance(o, ast.Name) and any(number(v) for v in bound.get(o.id, ()))
               for o in operands)


def _may_make_zero(outline: Outline, call: ast.Call) -> bool:
    """``_zero_producer`` on the ast, loosely: a norm or probability by the callee's last name or
    that of what it may stand for."""
    return bool(_zero_names(outline, call) & _ZERO_PRODUCERS)


def _zero_names(outline: Outline, call: ast.Call) -> set[str]:
    return {_called(call), *(q.rsplit(".", 1)[-1] for q in outline.qualified_names(call.func))}


def _surely_model_output(outline: Outline, call: ast.Call, owner: str | None,
                         bound: dict[str, list[ast.expr]]) -> bool:
    """A norm (surely not a probability) that ``_model_output`` drops: its arguments come from a
    call on ``self`` (``self.net(x)``), followed through the function's assignments."""
    if owner not in ("self", "cls") or not _zero_names(outline, call).isdisjoint(_PROBABILITIES):
        return False
    for node in _Slice([*call.args, *(k.value for k in call.keywords)], bound).calls():
        root = node.func
        while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(root, ast.Name) and root.id == owner:
            return True
    return False


def _submodules_making_zero(outline: Outline, owner: ast.ClassDef) -> frozenset[str]:
    """``_module_outputs`` on the ast, loosely: the attributes ``owner`` assigns an instance of
    a class of this file whose ``forward`` returns something with a norm or probability in it."""
    making_zero = {c.name for c in outline.nodes(ast.ClassDef) if any(
        isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == "forward" and any(
            isinstance(n, ast.Call) and _may_make_zero(outline, n)
            for r in outline.nodes(ast.Return) if r.value is not None and contains(m, r) for n in ast.walk(r.value))
        for m in c.body)}
    if not making_zero:
        return frozenset()
    return frozenset(t.attr for a in outline.nodes(ast.Assign) if contains(owner, a)
                     for t in a.targets if isinstance(t, ast.Attribute)
                     if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in making_zero
                            for n in ast.walk(a.value)))


def _names_in(node: ast.AST, deep: bool = True) -> list[str]:
    """The names libcst sees in ``node`` (with ``deep``, in all of it): a name, an attribute's
    name, a keyword's, a lambda's parameter."""
    found = []
    for n in ast.walk(node) if deep else (node,):
        if isinstance(n, ast.Name):
            found.append(n.id)
        elif isinstance(n, ast.Attribute):
            found.append(n.attr)
        elif isinstance(n, (ast.keyword, ast.arg)) and n.arg is not None:
            found.append(n.arg)
    return found


def _may_be_halved_classes(outline: Outline, calls: list[ast.Call]) -> list[ast.ClassDef]:
    """``_halved_classes`` on the ast, loosely: classes of this file an instance of which (a
    call of the class, or a name assigned one, behind `.cuda()`-like calls) gets `.half()` or a
    `.to(...)` naming float16."""
    classes = {c.name: c for c in outline.nodes(ast.ClassDef)}
    if not classes:
        return []

    def root(expr: ast.expr) -> ast.expr:
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            expr = expr.func.value
        return expr

    def made(expr: ast.expr, names: dict[str, str]) -> str | None:
        expr = root(expr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in classes:
            return expr.func.id
        return names.get(expr.id) if isinstance(expr, ast.Name) else None

    instances: dict[str, str] = {}
    for _ in range(2):  # the instance, or the name it was assigned to
        for a in outline.nodes(ast.Assign):
            made_here = made(a.value, instances)
            if made_here is not None:
                instances.update((t.id, made_here) for t in a.targets if isinstance(t, ast.Name))
    found = set()
    for c in calls:
        if isinstance(c.func, ast.Attribute) and (
                (c.func.attr == "half" and not c.args) or (c.func.attr == "to" and ("float16" in ast.dump(c)
                                                                                  or "half" in ast.dump(c)))):
            halved = made(c.func.value, instances)
            if halved is not None:
                found.add(halved)
    return [classes[name] for name in found]


def _tiny(node: cst.BaseExpression) -> float | None:
    if isinstance(node, cst.Float):
        try:
            value = float(node.value.replace("_", ""))
        except ValueError:
            return None
        return value if 0 < value < FP16_SMALLEST else None
    return None


def _single_binding(scope_body, name: str) -> cst.BaseExpression | None:
    """The value of the one plain assignment to ``name`` directly in ``scope_body`` (a module
    constant); None when it is assigned more than once or not at all."""
    values = []
    for statement in scope_body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and any(
                        isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets):
                    values.append(small.value)
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) \
                        and small.target.value == name and small.value is not None:
                    values.append(small.value)
    return values[0] if len(values) == 1 else None


def _rebound(ctx: FileContext, function: cst.FunctionDef, name: str) -> bool:
    return any(isinstance(t.target, cst.Name) and t.target.value == name
               for a in ctx.nodes(cst.Assign) if ctx.contains(function, a) for t in a.targets) or any(
        isinstance(a.target, cst.Name) and a.target.value == name
        for kind in (cst.AugAssign, cst.AnnAssign) for a in ctx.nodes(kind) if ctx.contains(function, a))


def _epsilon(ctx: FileContext, node: cst.BaseExpression) -> tuple[float, cst.CSTNode] | None:
    """The value of a tiny epsilon and where it is written: a literal, a module constant
    (``EPS = 1e-15``), or a parameter's default (``eps: float = 1e-8``) the function does not
    reassign."""
    value = _tiny(node)
    if value is not None:
        return value, node
    if not isinstance(node, cst.Name):
        return None
    function = enclosing_function(ctx, node)
    if function is not None:
        for param in (*function.params.params, *function.params.kwonly_params):
            if param.name.value == node.value:
                value = _tiny(param.default) if param.default is not None else None
                return (value, param) if value is not None and not _rebound(ctx, function, node.value) else None
        # A local constant: the one assignment the function makes to the name.
        local = [a.value for a in ctx.nodes(cst.Assign) if ctx.contains(function, a)
                 and any(isinstance(t.target, cst.Name) and t.target.value == node.value for t in a.targets)]
        if local:
            value = _tiny(local[0]) if len(local) == 1 and not any(
                isinstance(a.target, cst.Name) and a.target.value == node.value
                for kind in (cst.AugAssign, cst.AnnAssign) for a in ctx.nodes(kind) if ctx.contains(function, a)) \
                else None
            return (value, local[0]) if value is not None else None
    constant = _single_binding(ctx.module.body, node.value)
    value = _tiny(constant) if constant is not None else None
    return (value, constant) if value is not None else None


def _guard(ctx: FileContext, eps: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(the guarded expression, the value it guards) for ``x + eps``, ``x.clamp(min=eps)``,
    ``x.clamp_min(eps)``, ``torch.clamp(x, min=eps)``."""
    parent = ctx.parent(eps)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Add):
        return parent, parent.left if parent.right is eps else parent.right
    if not isinstance(parent, cst.Arg) or not isinstance(call := ctx.parent(parent), cst.Call):
        return None
    positional = [a for a in call.args if a.keyword is None]
    is_min = parent.keyword is not None and parent.keyword.value == "min"
    if any(n.startswith("torch.") and n.rsplit(".", 1)[-1] in _CLAMPS for n in ctx.qualified_names(call.func)):
        if positional and (is_min or len(positional) > 1 and positional[1] is parent):
            return call, positional[0].value
        return None
    mc = method_call(call)
    if mc is not None and mc[1] in _CLAMPS and not ctx.qualified_names(call.func) and \
            (is_min or positional and positional[0] is parent):
        return call, mc[0]
    return None


def _singular_use(ctx: FileContext, expr: cst.BaseExpression) -> str | None:
    """The op at 0 that ``expr`` feeds directly: a division by it, ``log(expr)``,
    ``expr.sqrt()``."""
    parent = ctx.parent(expr)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and parent.right is expr:
        return "division"
    if isinstance(parent, cst.Arg) and isinstance(call := ctx.parent(parent), cst.Call) and call.args[0] is parent:
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        return name if name in _SINGULAR else None
    if isinstance(parent, cst.Attribute) and parent.value is expr and parent.attr.value in _SINGULAR \
            and isinstance(ctx.parent(parent), cst.Call):
        return parent.attr.value
    return None


def _guarded_op(ctx: FileContext, guard: cst.BaseExpression, function: cst.FunctionDef) -> str | None:
    """What the guard protects: its direct use, or that of the name it is assigned to
    (``norm = x.norm().clamp(min=eps)``; ``v / norm``)."""
    direct = _singular_use(ctx, guard)
    if direct is not None:
        return direct
    parent = ctx.parent(guard)
    targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else \
        [parent.target] if isinstance(parent, cst.AnnAssign) else []
    names = {t.value for t in targets if isinstance(t, cst.Name)}
    for name in ctx.nodes(cst.Name):
        if name.value in names and ctx.contains(function, name) and ctx.order(name) > ctx.order(guard):
            use = _singular_use(ctx, name)
            if use is not None:
                return use
    return None


def _bound_values(ctx: FileContext, function: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    cache = ctx.__dict__.setdefault("_amp018_bound", {})
    if id(function) not in cache:
        found: dict[str, list[cst.BaseExpression]] = {}
        for kind in (cst.Assign, cst.AnnAssign):
            for node in ctx.nodes(kind):
                if node.value is None or not ctx.contains(function, node):
                    continue
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for target in targets:
                    for name in subtree(target):
                        if isinstance(name, cst.Name):
                            found.setdefault(name.value, []).append(node.value)
        cache[id(function)] = found
    return cache[id(function)]


def _names_wide_dtype(ctx: FileContext, expr: cst.BaseExpression, bound: dict) -> bool:
    """``torch.float32``, or a name bound to an expression that names float32/float64
    (``work_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype``)."""
    values = bound.get(expr.value, []) if isinstance(expr, cst.Name) else []
    return any(DTYPES.get(n) in _WIDE for node in (expr, *values) for part in subtree(node)
               if isinstance(part, (cst.Name, cst.Attribute)) for n in ctx.qualified_names(part))


def _fixed_dtype(ctx: FileContext, expr: cst.BaseExpression, bound: dict) -> bool:
    """A dtype the caller's tensor does not decide: float32/float64 by name, or the dtype of
    something the object holds (``self.store.dtype``)."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
        root = expr.value
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        return isinstance(root, cst.Name) and root.value == "self"
    return _names_wide_dtype(ctx, expr, bound)


def _widens(ctx: FileContext, call: cst.Call, bound: dict) -> bool:
    """``x.float()``, ``x.double()``, ``x.to(torch.float32)``, ``x.to(work_dtype)``,
    ``x.to(self.store.dtype)`` or a ``dtype=torch.float32`` argument: the value is computed in
    a dtype the caller's input does not set."""
    mc = method_call(call)
    if mc is not None and mc[1] in ("float", "double") and not call.args:
        return True
    if mc is not None and mc[1] in ("to", "type") and any(
            (a.keyword is None or a.keyword.value == "dtype") and _fixed_dtype(ctx, a.value, bound)
            for a in call.args):
        return True
    return any(a.keyword is not None and a.keyword.value == "dtype" and _fixed_dtype(ctx, a.value, bound)
               for a in call.args)


def _data_walk(node: cst.CSTNode):
    """The nodes the value of ``node`` is computed from: not an index (``logits[task_ids]``)
    and not a tensor's metadata (``x.shape``, ``dist.ndim``, ``x.size()``)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if isinstance(current, cst.Attribute) and current.attr.value in _METADATA:
            continue
        if isinstance(current, cst.Call) and isinstance(current.func, cst.Attribute) \
                and current.func.attr.value in _METADATA:
            continue
        stack.extend(c for c in children(current) if not isinstance(c, cst.SubscriptElement))


def _caller_tensor(ctx: FileContext, value: cst.BaseExpression,
                   function: cst.FunctionDef) -> tuple[str, str] | None:
    """The ``Tensor``-annotated parameter whose dtype ``value`` keeps and the op on the way
    that makes it exactly 0 in float16 (followed through the function's assignments and one
    level into this file's submodules), or None when either is missing or the computation is
    widened to float32 on the way."""
    tensors = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)
               if p.annotation is not None and "Tensor" in ctx.code(p.annotation.annotation)]
    bound = _bound_values(ctx, function)
    seen, zero = set(), None
    for node in _slice(ctx, value, function):
        if isinstance(node, cst.Call):
            if _widens(ctx, node, bound):
                return None
            made = _zero_producer(ctx, node)
            if made == "norm" and _model_output(ctx, node, function, bound):
                made = None  # a model's dense output or features: its norm is not 0 in practice
            zero = zero or made or next(
                (z for out in _module_outputs(ctx, node, function) for c in subtree(out)
                 if isinstance(c, cst.Call) and (z := _zero_producer(ctx, c))), None)
        elif isinstance(node, cst.Name):
            seen.add(node.value)
    tensor = next((t for t in tensors if t in seen), None)  # the first in the signature: the data, not an index
    return (tensor, zero) if tensor is not None and zero is not None else None


def _slice(ctx: FileContext, value: cst.BaseExpression, function: cst.FunctionDef):
    """The nodes ``value`` is computed from, following the names the function assigns."""
    bound = _bound_values(ctx, function)
    pending, seen = [value], set()
    while pending:
        for node in _data_walk(pending.pop()):
            yield node
            if isinstance(node, cst.Name) and node.value not in seen:
                seen.add(node.value)
                pending.extend(bound.get(node.value, []))


def _halved_classes(ctx: FileContext) -> dict[str, cst.Call]:
    """Classes of this file whose instances the file converts to float16, with the call that
    does it: ``Net(...).cuda().half()``, ``model = Net(...)``; ``model.to(torch.float16)``."""
    classes = {c.name.value for c in ctx.nodes(cst.ClassDef)}
    found: dict[str, cst.Call] = {}
    for call in ctx.nodes(cst.Call):
        mc = method_call(call)
        if mc is None or not (mc[1] == "half" and not call.args or mc[1] == "to" and any(
                (a.keyword is None or a.keyword.value == "dtype")
                and DTYPES.get(ctx.resolves_to(a.value, DTYPES.keys()) or "") == "float16" for a in call.args)):
            continue
        receiver = mc[0]
        for _ in range(2):  # the instance, or the name it was assigned to
            while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
                receiver = receiver.func.value  # .cuda(), .to(device), .eval()
            if isinstance(receiver, cst.Name) and receiver.value not in classes:
                receiver = assigned_before(ctx, receiver)
        if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value in classes:
            found.setdefault(receiver.func.value, call)
    return found


def _zero_producer(ctx: FileContext, call: cst.Call) -> str | None:
    """'norm' or 'probability' for an op whose float16 result is exactly 0 on ordinary input:
    the norm of a zero (or tiny) vector, a sigmoid or softmax that saturates."""
    names = {n.rsplit(".", 1)[-1] for n in ctx.qualified_names(call.func) if n.startswith("torch.")}
    mc = method_call(call)
    if not names and mc is not None and not ctx.qualified_names(call.func):
        names = {mc[1]}
    if names & _NORMS:
        return "norm"
    if names & _PROBABILITIES:
        return "probability"
    return None


def _module_outputs(ctx: FileContext, call: cst.Call, function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """For ``self.m(...)`` in a method, where ``__init__`` stores an instance of a class of this
    file on ``self.m``: what that class's ``forward`` returns."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and function.params.params
            and func.value.value == function.params.params[0].name.value):
        return []
    owner = ctx.parent(ctx.parent(function))
    if not isinstance(owner, cst.ClassDef):
        return []
    classes = {c.name.value: c for c in ctx.nodes(cst.ClassDef)}
    found = []
    for assign in ctx.nodes(cst.Assign):
        if not ctx.contains(owner, assign) or not any(
                isinstance(t.target, cst.Attribute) and t.target.attr.value == func.attr.value for t in assign.targets):
            continue
        for made in subtree(assign.value):
            if isinstance(made, cst.Call) and isinstance(made.func, cst.Name) and made.func.value in classes:
                forward = next((m for m in classes[made.func.value].body.body
                                if isinstance(m, cst.FunctionDef) and m.name.value == "forward"), None)
                if forward is not None:
                    found.extend(r.value for r in ctx.nodes(cst.Return) if ctx.contains(forward, r) and r.value)
    return found


def _model_output(ctx: FileContext, call: cst.Call, function: cst.FunctionDef, bound: dict) -> bool:
    """Whether ``call``'s arguments come from a submodule or method of ``self``
    (``self.transformer(...)``), followed through the function's assignments."""
    owner = function.params.params[0].name.value if function.params.params else None
    pending, seen = [a.value for a in call.args], set()
    while pending:
        for node in _data_walk(pending.pop()):
            if isinstance(node, cst.Call):
                root = node.func
                while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
                    root = root.func if isinstance(root, cst.Call) else root.value
                if isinstance(root, cst.Name) and root.value == owner and owner in ("self", "cls"):
                    return True
            if isinstance(node, cst.Name) and node.value not in seen:
                seen.add(node.value)
                pending.extend(bound.get(node.value, []))
    return False


def _private(ctx: FileContext, function: cst.FunctionDef) -> bool:
    """A helper named ``_like_this`` (or in such a class): its callers in the project decide
    its dtypes, which one file does not show."""
    names = [function.name.value] + [a.name.value for a in ctx.ancestors(function) if isinstance(a, cst.ClassDef)]
    return any(n.startswith("_") and not n.endswith("__") for n in names)


def _tested_positive(ctx: FileContext, eps: cst.CSTNode, value: cst.BaseExpression, function: cst.FunctionDef) -> bool:
    """The guard runs only where a condition compares the guarded value (``if norm > eps:``
    ``x / (norm + 1e-12)``): the epsilon is not what keeps it finite."""
    names = {n.value for n in subtree(value) if isinstance(n, cst.Name)}
    child: cst.CSTNode = eps
    for ancestor in ctx.ancestors(eps):
        if ancestor is function:
            return False
        test = ancestor.test if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) else None
        if isinstance(ancestor, cst.Call) and ctx.resolves_to(ancestor.func, {"torch.where"}) \
                and ancestor.args and child is not ancestor.args[0]:
            test = ancestor.args[0].value  # torch.where(theta > 0, x / (theta + 1e-10), y)
        if test is not None and any(isinstance(c, cst.Comparison) and names & {n.value for n in subtree(c)
                                                                               if isinstance(n, cst.Name)}
                                    for c in subtree(test)):
            return True
        child = ancestor
    return False


def _handles_half(ctx: FileContext, function: cst.FunctionDef) -> bool:
    """The function deals with float16 itself (``torch.float16``, ``torch.finfo``): its
    author chose what happens there."""
    return any(n in _HALF_AWARE for node in subtree(function)
               if isinstance(node, (cst.Name, cst.Attribute)) for n in ctx.qualified_names(node))


class EpsilonUnderflowsInFp16(Rule):
    """
    ## What it does
    Finds an epsilon smaller than float16's smallest subnormal (2**-24 ≈ 5.96e-8) where the
    value it is added to or clamps is float16. The epsilon is a float literal, a module
    constant (`EPS = 1e-15`) or a parameter's default (`eps: float = 1e-8`) the function does
    not reassign. Two places count:
    - a float16 autocast region: the epsilon as an operand of `+`, `-`, `/`, `*`, or an
      `eps=`/`epsilon=`/`min=` argument;
    - outside any region, a public function or method on tensors of its caller's dtype (a
      parameter annotated `Tensor`), where `x + eps`, `x.clamp(min=eps)` or
      `torch.clamp(x, min=eps)` guards a division, `log` or `sqrt` of a value that is exactly 0
      in float16 on ordinary input: the norm of the caller's data (the vector part of an
      identity quaternion) or a sigmoid/softmax probability, which saturates to 0 or 1
      (`-log(1 - sigmoid(x) + EPS)`), also one that a submodule this file defines returns.
      Libraries whose functions take float16 tensors (a `.half()` model, float16 images)
      run that guard in float16;
    - outside any region, in a class of this file whose instances the file converts to
      float16 (`Net().cuda().half()`, `model = Net()`; `model.to(torch.float16)`): any such
      guard of a division, `log` or `sqrt` in its methods, unless widened to float32 first.

    - outside any region, where a loss is computed (a function or class named like a loss,
      or a module's `forward` in a module named like one: `losses/distillation.py`) in a
      project whose other code enables float16 autocast (an autocast call that may run in
      float16, a framework setting): a guard of a division, `log` or `sqrt` of a value no op
      on its way makes float32 (no `.float()`, not the output of an op autocast runs in
      float32, not computed from the labels: names with `gt`, `target`, `label`); the message
      names the autocast call or setting.

    ## Why is this bad?
    In float16 the epsilon rounds to exactly 0, so `x / (norm + 1e-8)` divides by zero and
    `torch.log(p.clamp(min=1e-10))` takes the log of 0: the guard does nothing and the loss
    becomes inf/NaN as soon as the value it protects reaches 0.

    ## Example
    ```python
    with torch.autocast("cuda"):
        y = x / (x.norm(dim=-1, keepdim=True) + 1e-8)

    def quaternion_exp_to_log(quaternion: Tensor, eps: float = 1e-8) -> Tensor:
        norm = quaternion[..., 1:].norm(dim=-1, keepdim=True).clamp(min=eps)
        return quaternion[..., 1:] * torch.acos(quaternion[..., :1]) / norm
    ```

    ## Fix
    Use an epsilon float16 can hold (≥ 6e-8; 1e-5 to 1e-6 in practice, or one from
    `torch.finfo(x.dtype)`), or compute that step in float32 (`x.float()`, then cast back).

    ## Fix safety
    No automatic fix: the right epsilon depends on the computation.

    ## False positives
    In a region, operands that the policy tables say come out of a float32 op (a `softmax`,
    `norm` or `sum` under autocast on cuda) are not reported, nor are keyword arguments of
    calls whose ops autocast runs in float32 (`F.layer_norm(..., eps=1e-12)`). Operands of
    unknown origin in a float16 region are assumed float16.
    Outside regions the rule stays silent on computation widened to float32 or float64 on
    the way (`.float()`, `.to(torch.float32)`, `.to(work_dtype)` with `work_dtype` naming
    float32, `dtype=torch.float32`); on functions that deal with float16 themselves (they name
    `torch.float16` or `torch.finfo`); on private helpers (`_name`, or in a `_Class`), whose
    callers decide their dtypes; on the norm of a model's output or features (`self.net(x)`),
    which is not 0 in practice; on a guard that runs only where a condition compares the
    guarded value (`if norm > 0.9:`); and on values that do not reach 0 by a norm or a
    probability (sums, counts, variances: not known to be 0). A float16 model defined in
    another file, or a function whose callers pass float16 from another file, is not seen.
    """

    code = "AMP018"
    preview_paths = ("a guard on the caller's tensors (no half producer in the file), and a loss's guard in a project that enables float16 autocast in another file, run")
    name = "epsilon-underflows-in-fp16"
    summary = "Epsilon below float16's smallest value where the value it guards is float16"
    uses_policy = True
    # A float literal below 5.96e-8 (an exponent, or seven zeros after the point), in a file
    # that opens a region (one of the project's autocast wrappers counts), or added or clamped
    # (`_may_guard_tiny`): outside regions only a guard's epsilon is reported.
    fragments = ((_TINY, "autocast", TextTest(_has_tiny)), (_TINY, TextTest(_may_guard_tiny)))
    project_wrappers_for = "autocast"
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-9)).sum()
    h = F.layer_norm(x, x.shape[-1:], eps=1e-12)
    y = x / (x.norm(dim=-1, keepdim=True) + 1e-6)
"""),
        Valid("""
import torch
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = x / (x.abs().amax() + 1e-8)
"""),
        # Computed in float32 whatever the caller's dtype, then cast back.
        Valid("""
import torch
from torch import Tensor
def quaternion_exp_to_log(quaternion: Tensor, eps: float = 1.0e-8) -> Tensor:
    orig_dtype = quaternion.dtype
    work_dtype = torch.float32 if orig_dtype in (torch.float16, torch.bfloat16) else orig_dtype
    work = quaternion.to(work_dtype)
    norm = torch.norm(work[..., 1:4], p=2, dim=-1, keepdim=True).clamp(min=eps)
    return (work[..., 1:4] / norm).to(orig_dtype)
"""),
        # A private helper, the norm of a model's output, a guard under a comparison, a value
        # that is not a norm or a probability.
        Valid("""
import torch
from torch import Tensor, nn
def _normalize(points: Tensor, eps: float = 1e-8) -> Tensor:
    return points / (points.norm(dim=-1, keepdim=True) + eps)
class Guidance(nn.Module):
    def forward(self, latents: Tensor) -> Tensor:
        pred = self.net(latents)
        return pred / (torch.norm(pred, dim=-1, keepdim=True) + 1e-8)
def project(q: Tensor, limit: float = 0.9) -> Tensor:
    norm = torch.linalg.norm(q)
    if norm > limit:
        q = q * (limit / (norm + 1e-12))
    return q
def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / (mask.sum() + 1e-8)
"""),
        # The half model's forward widens to float32 before the guard.
        Valid("""
import torch
from torch import nn
class Net(nn.Module):
    def forward(self, x):
        h = self.body(x).float()
        return h / (h.abs().amax(dim=-1, keepdim=True) + 1e-8)
model = Net()
model = model.to(torch.float16)
"""),
        # Cast to the dtype of a stored float32 buffer; a torch.where that tests the divisor;
        # a norm that only lends its shape to the divisor.
        Valid("""
import torch
from torch import Tensor, nn
class Guard(nn.Module):
    def score(self, latent: Tensor) -> Tensor:
        pooled = latent.detach().to(self.store.dtype)
        return pooled / (pooled.norm(dim=-1, keepdim=True) + 1e-8)
def bend(phi: Tensor, theta: Tensor) -> Tensor:
    proj = torch.linalg.norm(theta, dim=-1)
    return torch.where(proj > 0, phi / (proj + 1e-10), phi)
def keypoint_distance(output: Tensor, target: Tensor, areas: Tensor, eps: float = 1e-8) -> Tensor:
    dist = torch.norm(output - target, dim=-1)
    areas = areas.reshape(*((1,) * (dist.ndim - 2)), -1, 1)
    return dist / areas.pow(0.5).clip(min=eps)
"""),
    )
    invalid = (
        Invalid("""
import torch
with torch.autocast("cuda"):
    h = model(x)
    y = h / (h.abs().amax(dim=-1, keepdim=True) + 1e-8)
    z = torch.log(y.clamp(min=1e-10))
""", at=((5, 51, "`1e-8` is below float16's smallest value (≈5.96e-8) and roun"), (6, 31, "`min=1e-10` is below float16's smallest value (≈5.96e-8) and"),)),
        # A model of this file converted to float16: its forward runs in float16.
        Invalid("""
import torch
from torch import nn
class Net(nn.Module):
    def forward(self, x):
        h = self.body(x)
        return h / (h.abs().amax(dim=-1, keepdim=True) + 1e-8)
model = Net().cuda().half()
""", at=((7, 58, "`1e-8` is below float16's smallest value (≈5.96e-8) and rounds to 0 in `Net`, which `Net().cuda().half()` on line 8 converts"),)),
        # A module constant in a region.
        Invalid("""
import torch
EPS = 1e-10
with torch.autocast("cuda"):
    h = model(x)
    y = h / (h.abs().amax() + EPS)
""", at=((6, 31, "`EPS` is below float16's smallest value"),)),
        # A default epsilon clamps the norm of the caller's vector, then divides by it.
        Invalid("""
import torch
from torch import Tensor
def quaternion_exp_to_log(quaternion: Tensor, eps: float = 1.0e-8) -> Tensor:
    vector = quaternion[..., 1:4]
    norm_q: Tensor = torch.norm(vector, p=2, dim=-1, keepdim=True).clamp(min=eps)
    return vector * torch.acos(torch.clamp(quaternion[..., 0:1], min=-1.0, max=1.0)) / norm_q
""", at=((6, 78, "`eps` (line 4) is below float16's smallest value (≈5.96e-8) and rounds to 0 when this runs in float16 (a float16 `quaternion` or model), where the norm it guards reaches 0: the division"),)),
        # A local constant: what `eps` holds in this function, not in another one.
        Invalid("""
import torch
from torch import Tensor
def unit(v: Tensor) -> Tensor:
    eps = 1e-10
    return v / (torch.linalg.norm(v, dim=-1, keepdim=True) + eps)
def soften(v: Tensor, eps: float = 1e-3) -> Tensor:
    return v / (v.norm() + eps)
""", at=((6, 62, "`eps` (line 5) is below float16's smallest value (≈5.96e-8) and rounds to 0 when this runs in float16 (a float16 `v` or model), where the norm it guards reaches 0: the division"),)),
        # A cast to the dtype of another input keeps the caller's dtype (the function below
        # widens to float32, and reports nothing).
        Invalid("""
import torch
from torch import Tensor
def cosine(a: Tensor, b: Tensor, eps: float = 1e-8) -> Tensor:
    b = b.to(a.dtype)
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + eps)
def cosine_wide(a: Tensor, b: Tensor, eps: float = 1e-8) -> Tensor:
    a, b = a.float(), b.float()
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + eps)
""", at=((6, 65, "`eps` (line 4) is below float16's smallest value (≈5.96e-8) and rounds to 0 when this runs in float16 (a float16 `a` or model), where the norm it guards reaches 0: the division"),)),
        # A loss in a project that enables float16 autocast elsewhere: the labels only index
        # the prediction, which the guarded value is computed from.
        Invalid("""
import torch
from torch import nn
class MaskedRangeLoss(nn.Module):
    def forward(self, pred, target, target_mask):
        picked = pred[target_mask]
        low, high = picked.min(), picked.max()
        scaled = (picked - low) / (high - low + 1e-8)
        return ((scaled - target[target_mask]) ** 2).mean()
""", at=((8, 49, "`1e-8` is below float16's smallest value (≈5.96e-8) and rounds to 0 in float16, and this project runs code under float16 autocast (trainer.py:4): if `MaskedRangeLoss.forward` runs there, the division"),),
            project=(("trainer.py", """
import torch
def train_step(loss_fn, batch):
    with torch.autocast("cuda"):
        return loss_fn(*batch)
"""),)),
        # A clamp guards a root taken of it (the clamp is the method's receiver).
        Invalid("""
import torch
from torch import Tensor
def scale_by_norm(x: Tensor, eps: float = 1e-10) -> Tensor:
    return x * torch.clamp(torch.linalg.norm(x, dim=-1, keepdim=True), min=eps).rsqrt()
""", at=((5, 76, "`eps` (line 4) is below float16's smallest value (≈5.96e-8) and rounds to 0 when this runs in float16 (a float16 `x` or model), where the norm it guards reaches 0: the rsqrt"),)),
        # A module constant guards the log of a probability a submodule of this file returns.
        Invalid("""
import torch
from torch import Tensor
EPS = 1e-15
class InnerProductDecoder(torch.nn.Module):
    def forward(self, z: Tensor, edge_index: Tensor, sigmoid: bool = True) -> Tensor:
        value = (z[edge_index[0]] * z[edge_index[1]]).sum(dim=1)
        return torch.sigmoid(value) if sigmoid else value
class GAE(torch.nn.Module):
    def __init__(self, encoder, decoder=None):
        super().__init__()
        self.encoder = encoder
        self.decoder = InnerProductDecoder() if decoder is None else decoder
    def recon_loss(self, z: Tensor, pos_edge_index: Tensor) -> Tensor:
        return -torch.log(self.decoder(z, pos_edge_index, sigmoid=True) + EPS).mean()
""", at=((15, 75, "`EPS` (line 4) is below float16's smallest value (≈5.96e-8) and rounds to 0 when this runs in float16 (a float16 `z` or model), where the probability it guards reaches 0: the log"),)),
    )

    def check(self, ctx: FileContext) -> None:
        # Names that may hold a tiny epsilon: module constants and parameters with such a default.
        candidates = {p.name.value for p in ctx.nodes(cst.Param) if p.default is not None and _tiny(p.default)}
        candidates |= {t.target.value for a in ctx.nodes(cst.Assign) if _tiny(a.value) for t in a.targets
                       if isinstance(t.target, cst.Name)}
        candidates |= {a.target.value for a in ctx.nodes(cst.AnnAssign)
                       if a.value is not None and _tiny(a.value) and isinstance(a.target, cst.Name)}

        def epsilon(node: cst.CSTNode) -> tuple[float, cst.CSTNode] | None:
            if isinstance(node, cst.Float) or isinstance(node, cst.Name) and node.value in candidates:
                return _epsilon(ctx, node)
            return None

        for node in ctx.nodes(cst.BinaryOperation):
            for literal, other in ((node.right, node.left), (node.left, node.right)):
                if epsilon(literal) is not None:
                    self._check_operand(ctx, literal, other)
        for node in ctx.nodes(cst.Arg):
            if node.keyword is not None and node.keyword.value in _EPS_KEYWORDS and epsilon(node.value):
                self._check_keyword(ctx, node)
        halved = _halved_classes(ctx)
        for kind in (cst.Float, cst.Name):
            for node in ctx.nodes(kind):
                if (found := epsilon(node)) is None or reaching_region(ctx, node) is not None:
                    continue
                owner = next((a.name.value for a in ctx.ancestors(node) if isinstance(a, cst.ClassDef)), None)
                if owner in halved:
                    self._check_half_model(ctx, node, found[1], owner, halved[owner])
                else:
                    before = len(ctx.diagnostics)
                    self._check_caller_dtype(ctx, node, found[1])
                    if len(ctx.diagnostics) == before:
                        self._check_project_float16(ctx, node, found[1])

    def _check_half_model(self, ctx: FileContext, eps: cst.BaseExpression, written: cst.CSTNode,
                          owner: str, half: cst.Call) -> None:
        """In a class whose instances this file converts to float16: every guard there runs in
        float16 unless the computation is widened first."""
        function = enclosing_function(ctx, eps)
        guard = _guard(ctx, eps)
        if function is None or guard is None or _guarded_op(ctx, guard[0], function) is None:
            return
        bound = _bound_values(ctx, function)
        if any(isinstance(n, cst.Call) and _widens(ctx, n, bound) for n in _slice(ctx, guard[1], function)):
            return
        origin = "" if written is eps else f" (line {ctx.location(ctx.offsets(written)[0]).row})"
        ctx.report(eps, f"`{ctx.code(eps)}`{origin} is below float16's smallest value (≈5.96e-8) and rounds "
                        f"to 0 in `{owner}`, which `{ctx.code(half)}` on line "
                        f"{ctx.location(ctx.offsets(half)[0]).row} converts to float16: the guard does "
                        "nothing; use ≥ 1e-6 or compute this step in float32")

    def _check_caller_dtype(self, ctx: FileContext, eps: cst.BaseExpression, written: cst.CSTNode) -> None:
        """Outside any region: a guard in a function on tensors of its caller's dtype."""
        function = enclosing_function(ctx, eps)
        guard = _guard(ctx, eps)
        if function is None or guard is None or _private(ctx, function) or _handles_half(ctx, function):
            return
        op = _guarded_op(ctx, guard[0], function)
        found = _caller_tensor(ctx, guard[1], function) if op is not None else None
        if found is None or _tested_positive(ctx, eps, guard[1], function):
            return
        tensor, zero = found
        origin = "" if written is eps else f" (line {ctx.location(ctx.offsets(written)[0]).row})"
        ctx.report(eps, f"`{ctx.code(eps)}`{origin} is below float16's smallest value (≈5.96e-8) and rounds "
                        f"to 0 when this runs in float16 (a float16 `{tensor}` or model), where the {zero} "
                        f"it guards reaches 0: the {op} gives inf/NaN; use ≥ 1e-6 (or one from "
                        "`torch.finfo(x.dtype)`), or compute this step in float32",
                   preview=True)  # no producer makes the caller's tensors half: a guess

    def _check_project_float16(self, ctx: FileContext, eps: cst.BaseExpression, written: cst.CSTNode) -> None:
        """Outside any region of this file, where a loss is computed (``crossfile.named_loss_place``)
        in a project whose other code enables float16 autocast: a guard of a division, log or
        root of a value nothing on its way makes float32 (an op autocast runs in float32, a
        cast), which runs in float16 when the loss runs in that region."""
        function = enclosing_function(ctx, eps)
        guard = _guard(ctx, eps)
        place = named_loss_place(ctx, eps)
        if function is None or guard is None or _handles_half(ctx, function) or place is None:
            return
        op = _guarded_op(ctx, guard[0], function)
        if op is None:
            return
        found = enabling_site(ctx, float16=True)
        if found is None:
            return
        site, where, related = found
        try:
            table = ctx.policy(site.device)
        except PolicyError:
            return
        value = guard[1]
        operands = [value.left, value.right] if isinstance(value, cst.BinaryOperation) else [value]
        if any(inferred_dtype(ctx, o, table, depth=4) == "float32" for o in operands):
            return  # made by an op autocast runs in float32 (a sum, a norm, a softmax), or promoted to it
        bound = _bound_values(ctx, function)
        def number(expr) -> bool:  # a Python number: a counter started at 0, a size, a count
            if isinstance(expr, cst.Integer):
                return True
            if isinstance(expr, (cst.Tuple, cst.List)):  # `count_a, count_b = 0, 0`
                return bool(expr.elements) and all(number(e.value) for e in expr.elements)
            if isinstance(expr, cst.Call):
                return isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _COUNTS \
                    or isinstance(expr.func, cst.Name) and expr.func.value == "len"
            return False

        if any(number(o) or isinstance(o, cst.Name) and any(number(v) for v in bound.get(o.value, ()))
               for o in operands):
            return
        slice_ = list(_slice(ctx, value, function))
        if any(isinstance(node, cst.Call) and _widens(ctx, node, bound) for node in slice_):
            return  # cast to float32 on the way: the epsilon survives
        if any(isinstance(node, cst.Name) and not _GROUND_TRUTH.isdisjoint(node.value.lower().split("_"))
               for node in slice_):
            return  # computed from the labels (boxes, targets), which the data loader gives in float32
        origin = "" if written is eps else f" (line {ctx.location(ctx.offsets(written)[0]).row})"
        ctx.report(eps, f"`{ctx.code(eps)}`{origin} is below float16's smallest value (≈5.96e-8) and rounds "
                        f"to 0 in float16, and this project runs code under float16 autocast ({where}): if "
                        f"{place} runs there, the {op} it guards gives inf/NaN at 0; use ≥ 1e-6 "
                        "or compute this step in float32", related=(related,),
                   preview=True)  # whether that region reaches this code is not shown

    @staticmethod
    def _fp16_region(ctx: FileContext, node: cst.CSTNode):
        """(table, where, related, through a call) of the float16 region ``node`` runs in (around
        it, or around a caller in this file: ``where`` then names it), or None."""
        region = reaching_region(ctx, node)
        if region is None or region[0] is None or region_dtype(ctx, region[0]) != "float16":
            return None
        if region[2] is None:
            return region_table(ctx, region[0]), "in this float16 region", (), False
        line, call = (ctx.location(ctx.offsets(n)[0]).row for n in (region[1], region[2]))
        switch = region_switch(ctx, region[0])
        when = f" {switch.when}" if switch else ""
        return (region_table(ctx, region[0]),
                f"in float16: this runs under the float16 autocast of line {line}{when}, through the call on line {call}",
                (Related(ctx.path, call, "runs it under float16 autocast"), *(switch.related if switch else ())), True)

    def _check_operand(self, ctx, literal, other) -> None:
        region = self._fp16_region(ctx, literal)
        # Through a call, what the caller passed is not seen: only an op of this function that
        # autocast lowers shows the value half.
        wanted = ("lowp",) if region is not None and region[3] else ("lowp", None)
        if region is not None and inferred_dtype(ctx, other, region[0]) in wanted:
            ctx.report(literal, f"`{ctx.code(literal)}` is below float16's smallest value (≈5.96e-8) "
                                f"and rounds to 0 {region[1]}: use ≥ 1e-6 or compute in float32", related=region[2])

    def _check_keyword(self, ctx, arg: cst.Arg) -> None:
        region = self._fp16_region(ctx, arg)
        call = ctx.parent(arg)
        if region is None or not isinstance(call, cst.Call):
            return
        policies = policies_of(region[0], call_spelling(ctx, call))
        if policies and policies <= FP32_FAMILY:
            return  # autocast runs this op in float32, where the epsilon survives
        ctx.report(arg.value, f"`{arg.keyword.value}={ctx.code(arg.value)}` is below float16's "
                              f"smallest value (≈5.96e-8) and rounds to 0 {region[1]}", related=region[2])
