"""Conditions on the torch version, evaluated for the torch version in use, and the code that
only older torch runs (version-gated fallbacks). Pure libcst; no torch.

The torch version in use is the configured ``torch-version`` (default: the newest table in
policies/). When ``torch-version`` is not configured and the project declares a lower torch
(``torch_requirement``: ``torch>=2.1`` in its pyproject.toml), the code runs on that one too:
a condition is known only where it has the same value on both, and the replacement of a
deprecated API counts as available only if the declared floor has it. A condition is
evaluated the way Python would, on a small set of values: strings, numbers, tuples, versions
(``packaging``, ``distutils``/``looseversion``, ``pkg_resources``), ``torch.__version__``
(which compares as a version with strings and tuples), torch's AMP attributes (for
``hasattr`` / ``getattr``), module-level names assigned once (in a ``try`` whose ``except``
assigns a default: as the ``try`` assigns it), and calls to module-level helper functions made
of assignments, ``if`` and ``return``. Such names and helpers may live in another module of the
project and be imported (``from .compat import TORCH_GE_2_4``, ``utils.torch_at_least("2.4")``,
re-exported by a package's ``__init__``): they are evaluated in their own module, and the
file's findings then depend on its text. Anything else is unknown, and so is a condition that
depends on it.
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from ..policy import PolicyError
from .context import FileContext
from .crossfile import imported_as
from .torch_requirement import TorchRequirement
from .names import dotted

# When each AMP name appeared in torch (none of them is gone by the newest table).
_INTRODUCED = {
    "torch.cuda.amp": "1.6", "torch.cuda.amp.autocast": "1.6", "torch.cuda.amp.GradScaler": "1.6",
    "torch.cuda.amp.custom_fwd": "1.6", "torch.cuda.amp.custom_bwd": "1.6",
    "torch.autocast": "1.10", "torch.amp": "1.12", "torch.amp.autocast": "1.12",
    "torch.cpu.amp": "1.10", "torch.cpu.amp.autocast": "1.10",
    "torch.amp.GradScaler": "2.3", "torch.GradScaler": "2.3", "torch.cpu.amp.GradScaler": "2.3",
    "torch.amp.custom_fwd": "2.4", "torch.amp.custom_bwd": "2.4",
}
# The device-generic API that replaced torch.cuda.amp / torch.cpu.amp: code that uses it and
# falls back when it is missing is a fallback for older torch.
_SUCCESSOR_PREFIXES = ("torch.amp.",)
_SUCCESSORS = frozenset({"torch.amp", "torch.autocast", "torch.GradScaler"})
# What a missing attribute or module, or an older signature, raises.
_MISSING_API_ERRORS = frozenset({"AttributeError", "ImportError", "ModuleNotFoundError", "TypeError",
                                 "Exception", "BaseException"})
_VERSION_TYPES = frozenset({
    "packaging.version.parse", "packaging.version.Version", "pkg_resources.parse_version",
    "distutils.version.LooseVersion", "distutils.version.StrictVersion",
    "looseversion.LooseVersion", "setuptools._distutils.version.LooseVersion",
})
_TORCH_VERSION = frozenset({"torch.__version__", "torch.version.__version__"})
_DISTRIBUTION_VERSION = frozenset({"importlib.metadata.version", "importlib_metadata.version"})
_STR_METHODS = frozenset({"split", "rsplit", "partition", "rpartition", "strip", "lstrip", "rstrip",
                          "startswith", "endswith", "replace", "lower"})
_DEPTH = 12  # nested names and helper calls followed before giving up


class _Unknown(Exception):
    """The condition depends on something this module does not evaluate."""


# What evaluating an expression the way Python would may raise besides _Unknown.
_EVAL_ERRORS = (_Unknown, TypeError, ValueError, IndexError, KeyError, AttributeError, OverflowError)


class Version:
    """A parsed version, ordered by its release numbers; a pre-release or dev release comes
    before its release (``2.4.0a0 < 2.4``), and ``2.4 == 2.4.0``."""

    def __init__(self, text: str):
        match = re.match(r"v?(\d+(?:\.\d+)*)(.*)", text.strip())
        if match is None:
            raise _Unknown(text)
        self.release = tuple(int(p) for p in match.group(1).split("."))
        rest = match.group(2)
        self._final = not re.match(r"[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", rest)

    def _key(self):
        release = self.release
        while len(release) > 1 and release[-1] == 0:
            release = release[:-1]
        return release, self._final

    def _other(self, other):
        if isinstance(other, Version):
            return other._key()
        raise _Unknown(other)

    def __eq__(self, other):
        return isinstance(other, Version) and self._key() == other._key()

    def __lt__(self, other):
        return self._key() < self._other(other)

    def __le__(self, other):
        return self._key() <= self._other(other)

    def __gt__(self, other):
        return self._key() > self._other(other)

    def __ge__(self, other):
        return self._key() >= self._other(other)

    __hash__ = None

    @property
    def major(self):
        return (self.release + (0,))[0]

    @property
    def minor(self):
        return (self.release + (0, 0))[1]

    @property
    def micro(self):
        return (self.release + (0, 0, 0))[2]

    @property
    def base_version(self):
        return ".".join(map(str, self.release))


class TorchVersionString(str):
    """``torch.__version__``: a string that compares as a version with strings, tuples and
    versions (torch's TorchVersion); its string methods give plain strings."""

    def _as_version(self, other) -> Version:
        if isinstance(other, Version):
            return other
        if isinstance(other, tuple):
            return Version(".".join(map(str, other)))
        if isinstance(other, str):
            return Version(other)
        raise _Unknown(other)

    def __lt__(self, other):
        return Version(self) < self._as_version(other)

    def __le__(self, other):
        return Version(self) <= self._as_version(other)

    def __gt__(self, other):
        return Version(self) > self._as_version(other)

    def __ge__(self, other):
        return Version(self) >= self._as_version(other)

    def __eq__(self, other):
        return Version(self) == self._as_version(other)

    def __ne__(self, other):
        return not self == other

    __hash__ = str.__hash__


class _Api:
    """A torch attribute or module, e.g. ``torch.amp``, for ``hasattr`` and ``getattr``."""

    def __init__(self, name: str):
        self.name = name


def torch_version(ctx: FileContext) -> str | None:
    """The torch version in use (e.g. ``"2.13.0"``), from the configured policy tables."""
    try:
        return ctx.policy().torch_version
    except (RuntimeError, PolicyError):
        return None


def _declared_floor(ctx: FileContext, newest: str) -> TorchRequirement | None:
    """The project's declared torch requirement when its floor lies below ``newest``."""
    required = ctx.torch_requirement()
    return required if required is not None and Version(required.floor) < Version(newest) else None


def gate_value(ctx: FileContext, test: cst.BaseExpression) -> bool | None:
    """What ``test`` (an ``if``'s condition) is under the torch version in use, and under the
    project's declared floor below it; None when those differ, or it does not depend only on
    the torch version (and constants)."""
    version = torch_version(ctx)
    value = None if version is None else _Evaluator(ctx, version).gate(test, 0)
    if value is None:
        return None
    required = _declared_floor(ctx, version)
    if required is not None and _Evaluator(ctx, required.floor).gate(test, 0) is not value:
        return None  # both branches run on some torch the project supports
    return value


def missing_on_supported_torch(ctx: FileContext, name: str) -> str | None:
    """Why some torch the code must run on lacks ``name`` (``torch.amp.GradScaler``): the
    project declares a floor below the version that added it (``"the project declares
    `torch>=2.1` (pyproject.toml)"``), or the configured ``torch-version`` is older. None
    when every such torch has it."""
    version = torch_version(ctx)
    if version is None or _INTRODUCED.get(name) is None:
        return None
    if _introduced(name, version) is False:
        return f"the torch-version in use is {version}"
    required = _declared_floor(ctx, version)
    if required is not None and _introduced(name, required.floor) is False:
        return f"the project declares `{required.declared}` ({required.source})"
    return None


def introduced_in(name: str) -> str | None:
    """The torch version that added ``name`` (``torch.amp.GradScaler``: ``"2.3"``)."""
    return _INTRODUCED.get(name)


def version_fallback(ctx: FileContext, node: cst.CSTNode) -> cst.CSTNode | None:
    """The gate that keeps ``node`` from running on the torch version in use, or None: an
    ``if``/``elif``/conditional expression whose condition, so evaluated, leads elsewhere, or a
    ``try`` that uses the device-generic AMP API and whose ``except`` around ``node`` catches
    what its absence raises (AttributeError, ImportError, ModuleNotFoundError, TypeError)."""
    version = torch_version(ctx)
    return None if version is None else _Evaluator(ctx, version).fallback(node, 0)


def _catches_missing_api(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [cst.Element(handler.type)]
    for element in kinds:
        parts = dotted(element.value)
        if parts is not None and parts[-1] in _MISSING_API_ERRORS:
            return True
    return False


def is_successor(name: str) -> bool:
    """Whether a qualified name is part of the device-generic AMP API (``torch.amp.*``,
    ``torch.autocast``, ``torch.GradScaler``)."""
    return name in _SUCCESSORS or name.startswith(_SUCCESSOR_PREFIXES)


def _uses_successor(ctx: FileContext, block: cst.CSTNode) -> bool:
    return any(ctx.contains(block, node) for node in _successor_uses(ctx))


def _successor_uses(ctx: FileContext) -> list[cst.CSTNode]:
    """The imports and references of the device-generic AMP API in the file."""
    found = ctx.__dict__.get("_amp_successor_uses")
    if found is None:
        found = []
        for stmt in ctx.nodes(cst.ImportFrom):
            if not stmt.relative and stmt.module is not None and not isinstance(stmt.names, cst.ImportStar):
                module = ".".join(dotted(stmt.module) or ())
                if any(is_successor(f"{module}.{alias.evaluated_name}") for alias in stmt.names):
                    found.append(stmt)
        found += [stmt for stmt in ctx.nodes(cst.Import)
                  if any(is_successor(alias.evaluated_name) for alias in stmt.names)]
        found += [node for kind in (cst.Name, cst.Attribute) for node in ctx.nodes(kind)
                  if any(is_successor(q) for q in ctx.qualified_names(node))]
        ctx.__dict__["_amp_successor_uses"] = found
    return found


def _truth(value) -> bool:
    if isinstance(value, _Api):
        return True
    if isinstance(value, (str, int, float, tuple, list, type(None))):
        return bool(value)
    raise _Unknown(value)


def _introduced(name: str, version: str) -> bool | None:
    since = _INTRODUCED.get(name)
    return None if since is None else Version(version) >= Version(since)


class _Evaluator:
    def __init__(self, ctx: FileContext, version: str):
        self.ctx = ctx
        self.version = version if version.count(".") >= 2 else version + ".0"
        # module-level names: (value, whether it depends on torch), or None: unknown
        self._names: dict[str, tuple | None] = {}
        self._torch = False  # whether the expression evaluated so far depends on torch

    def gate(self, test: cst.BaseExpression, depth: int) -> bool | None:
        cache = self.ctx.__dict__.setdefault("_version_gates", {}).setdefault(self.version, {})
        hit = cache.get(id(test))
        if hit is not None and hit[0] is test:
            return hit[1]
        outer, self._torch = self._torch, False
        try:
            value = _truth(self.value(test, {}, depth))
        except _EVAL_ERRORS:
            value = None
        if not self._torch:
            value = None  # a constant, not a gate on the torch version
        self._torch = outer or self._torch
        if depth == 0:  # deeper answers may be cut short by the depth limit
            cache[id(test)] = (test, value)
        return value

    def fallback(self, node: cst.CSTNode, depth: int) -> cst.CSTNode | None:
        child = node
        for ancestor in self.ctx.ancestors(node):
            if isinstance(ancestor, (cst.If, cst.IfExp)):
                if child is ancestor.body and self.gate(ancestor.test, depth) is False:
                    return ancestor
                if child is ancestor.orelse and self.gate(ancestor.test, depth) is True:
                    return ancestor
            elif isinstance(ancestor, cst.Try) and isinstance(child, cst.ExceptHandler):
                if _catches_missing_api(child) and _uses_successor(self.ctx, ancestor.body):
                    return ancestor
            child = ancestor
        return None

    def value(self, expr: cst.BaseExpression, env: dict, depth: int):
        if depth > _DEPTH:
            raise _Unknown(expr)
        method = getattr(self, f"_{type(expr).__name__}", None)
        if method is None:
            raise _Unknown(expr)
        return method(expr, env, depth + 1)

    # -- literals ------------------------------------------------------------------------

    def _Integer(self, expr, env, depth):
        return expr.evaluated_value

    def _Float(self, expr, env, depth):
        return expr.evaluated_value

    def _SimpleString(self, expr, env, depth):
        value = expr.evaluated_value
        if not isinstance(value, str):
            raise _Unknown(expr)
        return value

    def _ConcatenatedString(self, expr, env, depth):
        return self.value(expr.left, env, depth) + self.value(expr.right, env, depth)

    def _FormattedString(self, expr, env, depth):
        text = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                text.append(part.value)
            elif part.conversion is None and part.format_spec is None:
                text.append(str(self.value(part.expression, env, depth)))
            else:
                raise _Unknown(part)
        return "".join(text)

    def _Tuple(self, expr, env, depth):
        return tuple(self._elements(expr.elements, env, depth))

    def _List(self, expr, env, depth):
        return list(self._elements(expr.elements, env, depth))

    def _elements(self, elements, env, depth):
        for element in elements:
            if isinstance(element, cst.StarredElement):
                yield from self.value(element.value, env, depth)
            else:
                yield self.value(element.value, env, depth)

    # -- operators -----------------------------------------------------------------------

    def _UnaryOperation(self, expr, env, depth):
        if isinstance(expr.operator, cst.Not):
            # `not` of something unknown is unknown
            return not _truth(self.value(expr.expression, env, depth))
        if isinstance(expr.operator, cst.Minus):
            return -self.value(expr.expression, env, depth)
        raise _Unknown(expr)

    def _BooleanOperation(self, expr, env, depth):
        # Three-valued: `unknown and False` is False, `unknown or True` is True.
        try:
            left = self.value(expr.left, env, depth)
            decided = _truth(left)
        except _EVAL_ERRORS:
            right = _truth(self.value(expr.right, env, depth))
            if isinstance(expr.operator, cst.And) and not right:
                return False
            if isinstance(expr.operator, cst.Or) and right:
                return True
            raise
        if isinstance(expr.operator, cst.And):
            return self.value(expr.right, env, depth) if decided else left
        return left if decided else self.value(expr.right, env, depth)

    def _Comparison(self, expr, env, depth):
        left = self.value(expr.left, env, depth)
        for target in expr.comparisons:
            right = self.value(target.comparator, env, depth)
            if not _compare(target.operator, left, right):
                return False
            left = right
        return True

    def _BinaryOperation(self, expr, env, depth):
        left, right = self.value(expr.left, env, depth), self.value(expr.right, env, depth)
        if isinstance(expr.operator, cst.Add):  # `(2, 4) + extra`, `prefix + "2.4"`
            return left + right
        raise _Unknown(expr)

    def _IfExp(self, expr, env, depth):
        taken = expr.body if _truth(self.value(expr.test, env, depth)) else expr.orelse
        return self.value(taken, env, depth)

    def _Subscript(self, expr, env, depth):
        value = self.value(expr.value, env, depth)
        if len(expr.slice) != 1:
            raise _Unknown(expr)
        index = expr.slice[0].slice
        if isinstance(index, cst.Index):
            return value[self.value(index.value, env, depth)]
        bounds = [None if part is None else self.value(part, env, depth)
                  for part in (index.lower, index.upper, index.step)]
        return value[slice(*bounds)]

    # -- names, attributes and calls -------------------------------------------------------

    def _Name(self, expr, env, depth):
        if expr.value in env:
            return env[expr.value]
        if expr.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[expr.value]
        imported = self._imported(expr)
        if imported is not None:
            return imported
        if self._local_to_function(expr):
            raise _Unknown(expr)
        if expr.value in _BUILTIN_VALUES and expr.value not in _module_bindings(self.ctx):
            return _BUILTIN_VALUES[expr.value]
        return self._module_name(expr.value, depth)

    def _Attribute(self, expr, env, depth):
        imported = self._imported(expr)
        if imported is not None:
            return imported
        elsewhere = self._imported_from_project(expr)
        if elsewhere is not None:
            other, name = elsewhere
            return self._asking(other, lambda: other._module_name(name, depth))
        if dotted(expr) is not None and self.ctx.qualified_names(expr):
            raise _Unknown(expr)  # some other imported thing
        value = self.value(expr.value, env, depth)
        name = expr.attr.value
        if isinstance(value, Version) and name in ("release", "major", "minor", "micro", "base_version"):
            return getattr(value, name)
        if isinstance(value, _Api):
            return self._attribute_of(value, name)
        raise _Unknown(expr)

    def _imported(self, expr):
        """The value of an imported name (``torch.__version__``, ``torch.amp``), or None."""
        for name in self.ctx.qualified_names(expr):
            if name in _TORCH_VERSION:
                self._torch = True
                return TorchVersionString(self.version)
            if name in _INTRODUCED or name == "torch":
                self._torch = True
                return _Api(name)
        return None

    def _attribute_of(self, api: _Api, name: str):
        qualified = f"{api.name}.{name}"
        present = _introduced(qualified, self.version)
        if present is None:
            raise _Unknown(qualified)
        if not present:
            raise AttributeError(qualified)
        return _Api(qualified)

    def _Call(self, expr, env, depth):
        if any(arg.star for arg in expr.args):
            raise _Unknown(expr)
        names = self.ctx.qualified_names(expr.func)
        positional = [self.value(a.value, env, depth) for a in expr.args if a.keyword is None]
        keywords = {a.keyword.value: self.value(a.value, env, depth) for a in expr.args if a.keyword is not None}
        if names & _VERSION_TYPES and len(positional) == 1 and not keywords:
            return Version(str(positional[0]))
        if names & _DISTRIBUTION_VERSION and positional == ["torch"]:
            self._torch = True
            return self.version
        if isinstance(expr.func, cst.Name) and expr.func.value in env:
            raise _Unknown(expr)
        elsewhere = self._imported_from_project(expr.func)
        if elsewhere is not None:  # a helper of another module: `utils.torch_at_least("2.4")`
            other, name = elsewhere
            return self._asking(other, lambda: other._helper(name, positional, keywords, depth))
        if isinstance(expr.func, cst.Name) and not names:
            builtin = self._builtin(expr, positional, keywords)
            if builtin is not _NOT_BUILTIN:
                return builtin
            return self._helper(expr.func.value, positional, keywords, depth)
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _STR_METHODS and not keywords:
            owner = self.value(expr.func.value, env, depth)
            if isinstance(owner, str):
                return getattr(str(owner), expr.func.attr.value)(*positional)
        raise _Unknown(expr)

    def _builtin(self, expr, positional, keywords):
        name = expr.func.value
        if name in _module_bindings(self.ctx):
            return _NOT_BUILTIN  # the module's own function of that name
        if name in ("hasattr", "getattr") and isinstance(positional[0], _Api) and not keywords:
            try:
                found = self._attribute_of(positional[0], positional[1])
            except AttributeError:
                if name == "hasattr":
                    return False
                if len(positional) == 3:
                    return positional[2]
                raise _Unknown(expr)
            return True if name == "hasattr" else found
        if keywords:
            raise _Unknown(expr)
        if name in _BUILTIN_VALUES and len(positional) <= 1:
            return _BUILTIN_VALUES[name](*positional)
        if name == "map" and len(positional) == 2 and positional[0] is int:
            return [int(x) for x in positional[1]]
        return _NOT_BUILTIN

    def _GeneratorExp(self, expr, env, depth):
        return self._comprehension(expr, env, depth)

    def _ListComp(self, expr, env, depth):
        return self._comprehension(expr, env, depth)

    def _comprehension(self, expr, env, depth):
        loop = expr.for_in
        if loop.inner_for_in is not None or loop.ifs or not isinstance(loop.target, cst.Name) or loop.asynchronous:
            raise _Unknown(expr)
        items = self.value(loop.iter, env, depth)
        return [self.value(expr.elt, {**env, loop.target.value: item}, depth) for item in items]

    # -- module-level names and helper functions ---------------------------------------------

    def _module_name(self, name: str, depth: int):
        """A module-level name's value: its assignments outside version-gated fallbacks must
        all be plain ``name = value`` and agree. Each name is worked out once per evaluation,
        and one that depends on itself is unknown."""
        if name not in self._names:
            self._names[name] = None  # unknown while it is being worked out
            outer, self._torch = self._torch, False
            try:
                self._names[name] = (self._assigned_value(name, depth), self._torch)
            except _EVAL_ERRORS:
                pass
            self._torch = outer
        found = self._names[name]
        if found is None:
            raise _Unknown(name)
        self._torch = self._torch or found[1]
        return found[0]

    def _assigned_value(self, name: str, depth: int):
        values = []
        bindings = _module_bindings(self.ctx).get(name, ())
        for binding in bindings:
            if self.fallback(binding, depth) is not None:
                self._torch = True  # which binding runs depends on torch
                continue
            if self._in_handler_of_binding_try(binding, bindings):
                continue  # runs only when the `try` that binds the name failed
            if isinstance(binding, cst.ImportAlias) and isinstance(self.ctx.parent(binding), cst.ImportFrom):
                values.append(self._imported_value(self.ctx.parent(binding), binding, depth))
                continue
            if not isinstance(binding, (cst.Assign, cst.AnnAssign)):
                raise _Unknown(name)
            values.append(self.value(binding.value, {}, depth))
        if not values or any(v != values[0] or type(v) is not type(values[0]) for v in values):
            raise _Unknown(name)
        return values[0]

    def _in_handler_of_binding_try(self, binding: cst.CSTNode, bindings) -> bool:
        """Whether ``binding`` sits in an ``except`` of a ``try`` whose body binds the same
        name: what the name holds when the body ran (``_torch_version = Version(torch.__version__)``
        beside ``except Exception: _torch_version = Version("0.0.0")``)."""
        child = binding
        for ancestor in self.ctx.ancestors(binding):
            if isinstance(ancestor, cst.Try) and isinstance(child, cst.ExceptHandler):
                return any(other is not binding and self.ctx.contains(ancestor.body, other) for other in bindings)
            child = ancestor
        return False

    def _imported_value(self, statement: cst.ImportFrom, alias: cst.ImportAlias, depth: int):
        """A name imported from another module of the project: its value there."""
        if isinstance(statement.names, cst.ImportStar):
            raise _Unknown(alias)
        module = ".".join(dotted(statement.module) or ()) if statement.module is not None else None
        other = self.ctx.project_module(module, len(statement.relative))
        if other is None:
            raise _Unknown(alias)
        evaluator = _Evaluator(other, self.version)
        return self._asking(evaluator, lambda: evaluator._module_name(alias.evaluated_name, depth))

    def _imported_from_project(self, expr: cst.BaseExpression) -> "tuple[_Evaluator, str] | None":
        """The module of the project ``expr`` (``torch_at_least``, ``utils.TORCH_GE``) is
        imported from, as an evaluator of that module, and its name there; None for anything
        else."""
        for module, level, name in imported_as(self.ctx, expr):
            other = self.ctx.project_module(module, level)
            if other is not None:
                return _Evaluator(other, self.version), name
        return None

    def _asking(self, other: "_Evaluator", question):
        """``question``'s answer, asked of another module's evaluator: the gate depends on
        torch if that answer does."""
        try:
            return question()
        finally:
            self._torch = self._torch or other._torch

    def _local_to_function(self, name: cst.Name) -> bool:
        for ancestor in self.ctx.ancestors(name):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)) \
                    and name.value in _function_locals(self.ctx, ancestor):
                return True
        return False

    def _helper(self, name: str, positional: list, keywords: dict, depth: int):
        """Call a module-level function of assignments, ``if`` and ``return`` with the values
        of its arguments."""
        bindings = _module_bindings(self.ctx).get(name, [])
        if len(bindings) != 1 or not isinstance(bindings[0], cst.FunctionDef):
            raise _Unknown(name)
        function = bindings[0]
        params = function.params
        if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None \
                or params.posonly_params or params.kwonly_params:
            raise _Unknown(name)
        if len(positional) > len(params.params):
            raise _Unknown(name)
        local = {}
        for i, param in enumerate(params.params):
            key = param.name.value
            if i < len(positional):
                local[key] = positional[i]
            elif key in keywords:
                local[key] = keywords.pop(key)
            elif param.default is not None:
                local[key] = self.value(param.default, {}, depth)
            else:
                raise _Unknown(name)
        if keywords:
            raise _Unknown(name)
        if not isinstance(function.body, cst.IndentedBlock):
            raise _Unknown(name)
        returned = self._run(function.body.body, local, depth)
        if returned is _FELL_THROUGH:
            return None
        return returned

    def _run(self, statements, local: dict, depth: int):
        for statement in statements:
            if isinstance(statement, cst.If):
                branch = statement.body.body if _truth(self.value(statement.test, local, depth)) else (
                    [statement.orelse] if isinstance(statement.orelse, cst.If)
                    else statement.orelse.body.body if statement.orelse is not None else [])
                returned = self._run(branch, local, depth)
                if returned is not _FELL_THROUGH:
                    return returned
                continue
            if not isinstance(statement, cst.SimpleStatementLine):
                raise _Unknown(statement)
            for small in statement.body:
                if isinstance(small, cst.Return):
                    return None if small.value is None else self.value(small.value, local, depth)
                if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                        and isinstance(small.targets[0].target, cst.Name):
                    local[small.targets[0].target.value] = self.value(small.value, local, depth)
                elif isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString,
                                                                              cst.ConcatenatedString)):
                    continue  # a docstring
                elif isinstance(small, cst.Global):
                    continue  # an assignment after it would be local here: taken as one
                elif not isinstance(small, cst.Pass):
                    raise _Unknown(small)
        return _FELL_THROUGH


_NOT_BUILTIN = object()
_BUILTIN_VALUES = {"int": int, "float": float, "str": str, "tuple": tuple, "list": list, "len": len,
                   "bool": bool}
_FELL_THROUGH = object()


def _compare(operator, left, right) -> bool:
    if isinstance(operator, cst.Is):
        if right is None or left is None:
            return left is right
        raise _Unknown(operator)
    if isinstance(operator, cst.IsNot):
        if right is None or left is None:
            return left is not right
        raise _Unknown(operator)
    if isinstance(left, _Api) or isinstance(right, _Api):
        raise _Unknown(operator)
    if isinstance(operator, cst.Equal):
        return left == right
    if isinstance(operator, cst.NotEqual):
        return left != right
    if isinstance(operator, cst.LessThan):
        return left < right
    if isinstance(operator, cst.LessThanEqual):
        return left <= right
    if isinstance(operator, cst.GreaterThan):
        return left > right
    if isinstance(operator, cst.GreaterThanEqual):
        return left >= right
    if isinstance(operator, cst.In):
        return left in right
    if isinstance(operator, cst.NotIn):
        return left not in right
    raise _Unknown(operator)


_NESTED_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp,
                  cst.GeneratorExp)


def _bindings(ctx: FileContext) -> Iterator[tuple[cst.CSTNode, set[str]]]:
    """Every statement or node that binds names, with the names: assignments (the ``Assign``),
    augmented and annotated ones, loops, ``as`` names, imports, defs and classes."""
    for target in ctx.nodes(cst.AssignTarget):
        yield ctx.parent(target), _target_names(target.target)
    for kind in (cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr):
        for node in ctx.nodes(kind):
            yield node, _target_names(node.target)
    for node in ctx.nodes(cst.AnnAssign):
        if node.value is not None:
            yield node, _target_names(node.target)
    for node in ctx.nodes(cst.AsName):
        if not isinstance(ctx.parent(node), cst.ImportAlias):
            yield node, _target_names(node.name)
    for node in ctx.nodes(cst.ImportAlias):
        yield node, {node.evaluated_alias or node.evaluated_name.split(".")[0]}
    for kind in (cst.FunctionDef, cst.ClassDef):
        for node in ctx.nodes(kind):
            yield node, {node.name.value}


def _module_bindings(ctx: FileContext) -> dict[str, list[cst.CSTNode]]:
    """What binds each module-level name: the bindings outside functions, classes and
    comprehensions, and every function that declares the name ``global`` and binds it."""
    found = ctx.__dict__.get("_module_bindings")
    if found is None:
        found = {}
        bound_in: dict[int, set[str]] = {}  # by function: the names bound in its body
        for node, names in _bindings(ctx):
            if not any(isinstance(a, _NESTED_SCOPES) for a in ctx.ancestors(node)):
                for name in names:
                    found.setdefault(name, []).append(node)
            function = next((a for a in ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
            if function is not None:
                bound_in.setdefault(id(function), set()).update(names)
        for declaration in ctx.nodes(cst.Global):
            function = next((a for a in ctx.ancestors(declaration) if isinstance(a, cst.FunctionDef)), None)
            for item in declaration.names if function is not None else ():
                if item.name.value in bound_in.get(id(function), ()):
                    found.setdefault(item.name.value, []).append(function)
        ctx.__dict__["_module_bindings"] = found
    return found


def _target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def _function_locals(ctx: FileContext, function: cst.FunctionDef | cst.Lambda) -> frozenset[str]:
    """The names that may be local to ``function``: its parameters and what its body binds
    (nested scopes included, to err on the side of unknown), less those declared ``global``."""
    by_function = ctx.__dict__.get("_function_locals")
    if by_function is None:
        bound: dict[int, set[str]] = {}
        declared: dict[int, set[str]] = {}
        for node, names in _bindings(ctx):
            for ancestor in ctx.ancestors(node):
                if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                    bound.setdefault(id(ancestor), set()).update(names)
        for param in ctx.nodes(cst.Param):
            for ancestor in ctx.ancestors(param):
                if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                    bound.setdefault(id(ancestor), set()).add(param.name.value)
        for declaration in ctx.nodes(cst.Global):
            for ancestor in ctx.ancestors(declaration):
                if isinstance(ancestor, cst.FunctionDef):
                    declared.setdefault(id(ancestor), set()).update(n.name.value for n in declaration.names)
                    break
        by_function = ctx.__dict__["_function_locals"] = {
            key: frozenset(names - declared.get(key, set())) for key, names in bound.items()}
    return by_function.get(id(function), frozenset())
