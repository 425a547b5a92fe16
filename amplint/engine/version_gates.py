"""Conditions on the torch version, evaluated for the torch version in use, and the code that
only older torch runs (version-gated fallbacks). Read from Python's ``ast``; no torch.

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
depends on it. Names resolve through imports with Python's scoping (``ast_names``).

A condition that reads the torch version (a name in it, or in a helper it calls, holds it; a
call names the torch distribution, ``"torch"`` or ``"torch>=2.4"``) but cannot be worked out
still gates a fallback when the arm it does not take uses the device-generic AMP API: code
that chooses between ``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` on
the torch version keeps the old one for older torch.
"""

from __future__ import annotations

import ast
import re
import weakref
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

from ..policy import PolicyError
from .ast_names import AstImportResolver, dotted, file_resolver
from .checked_file import CheckedFile
from .crossfile import imported_as
from .outline import ModulesByText, Outline, contains, walk
from .project_index import (
    Dependency,
    module_dependency,
    module_text,
    project_module,
    project_root,
    star_dependency,
    star_imports,
)
from .source import split_lines
from .torch_requirement import TorchRequirement

# When each AMP name appeared in torch (none of them is gone by the newest table).
_INTRODUCED = {
    "torch.cuda.amp": "1.6", "torch.cuda.amp.autocast": "1.6", "torch.cuda.amp.GradScaler": "1.6",
    "torch.cuda.amp.custom_fwd": "1.6", "torch.cuda.amp.custom_bwd": "1.6",
    "torch.autocast": "1.10", "torch.amp": "1.12", "torch.amp.autocast": "1.12",
    "torch.cpu.amp": "1.10", "torch.cpu.amp.autocast": "1.10",
    "torch.amp.GradScaler": "2.3", "torch.GradScaler": "2.3", "torch.cpu.amp.GradScaler": "2.3",
    "torch.amp.custom_fwd": "2.4", "torch.amp.custom_bwd": "2.4",
}
# The per-device API torch 2.4 deprecated: qualified name -> (its name in torch.amp, device).
DEPRECATED_AMP = {f"torch.{device}.amp.{module}{name}": (name, device) for device in ("cuda", "cpu")
                  for name, module in (("autocast", ""), ("autocast", "autocast_mode."), ("GradScaler", ""),
                                       ("GradScaler", "grad_scaler."), ("custom_fwd", ""),
                                       ("custom_fwd", "autocast_mode."), ("custom_bwd", ""),
                                       ("custom_bwd", "autocast_mode."))}
DEPRECATED_SINCE = "2.4"
# Their positional parameters, which their torch.amp equivalents take after the device.
OLD_PARAMETERS = {
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "GradScaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
    "custom_fwd": ("fwd",),
    "custom_bwd": ("bwd",),
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
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
                  ast.DictComp, ast.GeneratorExp)


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


class ModuleCode:
    """One module as the gates read it: its ``ast`` (an ``Outline``: its nodes by type and
    each node's parent), what its names stand for, and what was worked out of it (``facts``,
    by kind)."""

    def __init__(self, path: str, source: str, outline: Outline, root: Path | None,
                 imports: Callable[[], AstImportResolver] | None = None):
        self.path, self.source, self.outline, self.root = path, source, outline, root
        self._make_imports = imports
        self.read: set[Dependency] = set()  # what of the project its names were resolved from
        self.facts: dict = {}

    @cached_property
    def imports(self) -> AstImportResolver:
        if self._make_imports is not None:
            return self._make_imports()

        def star() -> dict[str, frozenset[str]]:
            path = Path(self.path).resolve()
            self.read.add(star_dependency(self.root, path))
            return star_imports(self.root, path)

        return AstImportResolver(self.outline, star if self.root is not None else None)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.outline.parents.get(id(node))

    def nodes(self, *kinds: type) -> list:
        """The nodes of these types, in no particular order."""
        return [n for kind in kinds for n in self.outline.nodes(kind)]

    def in_order(self, kind: type) -> list:
        """The nodes of one type (with a position), in source order."""
        found = self.facts.get(("in order", kind))
        if found is None:
            found = self.facts["in order", kind] = sorted(
                self.outline.nodes(kind), key=lambda n: (n.lineno, n.col_offset, -n.end_lineno, -n.end_col_offset))
        return found

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def scopes_around(self, node: ast.AST) -> tuple[ast.AST, ...]:
        """The nested scopes (``_NESTED_SCOPES``) that ``node`` sits in, innermost first. Each
        node's answer is kept: a walk up stops at the first node answered."""
        known = self.facts.setdefault("scopes around", {})
        walked: list[tuple[ast.AST, ast.AST]] = []
        current = node
        while id(current) not in known:
            parent = self.parent(current)
            if parent is None:
                known[id(current)] = ()
                break
            walked.append((current, parent))
            current = parent
        for child, parent in reversed(walked):
            outer = known[id(parent)]
            known[id(child)] = (parent, *outer) if isinstance(parent, _NESTED_SCOPES) else outer
        return known[id(node)]

    def qualified_names(self, expr: ast.AST) -> set[str]:
        return self.imports.qualified_names(expr)

    def on_own_line(self, statement: ast.stmt) -> bool:
        """Whether ``statement`` starts its line (an indented block's), not a suite on its
        header's line (``if x: return y``), which leaves a helper unknown."""
        line = self._lines[statement.lineno - 1].encode("utf-8")
        return not line[:statement.col_offset].strip()

    @cached_property
    def _lines(self) -> list[str]:
        return split_lines(self.source)


def checked_code(ctx: CheckedFile) -> ModuleCode:
    """The checked file as the gates read it, from the ``ast`` its check parsed."""
    if "_gates_code" not in ctx.__dict__:
        outline = ctx.outline
        # held by the context: it reaches the context weakly, or the two make a cycle that
        # keeps the file's trees alive while the collector is paused
        checked = weakref.ref(ctx)
        ctx.__dict__["_gates_code"] = ModuleCode(ctx.path, ctx.source, outline, ctx.project_root(),
                                                 lambda: file_resolver(checked(), outline))
    return ctx.__dict__["_gates_code"]


# The project's modules the gates read (names and helpers imported from them), by path and
# text: a module that many files import is parsed once.
_PROJECT_MODULES: ModulesByText[ModuleCode] = ModulesByText(64)


def _project_module(checked: CheckedFile, code: ModuleCode, module: str | None, level: int) -> ModuleCode | None:
    """The module of ``code``'s project that ``from <level dots><module> import ...`` reads
    there; None for another library's module, ``code`` itself, or one that does not parse.
    The checked file's findings then depend on that module's text."""
    root = code.root
    if root is None:
        return None
    path = project_module(root, Path(code.path), module, level)
    if path is None or path.resolve() == Path(code.path).resolve():
        return None
    checked.dependencies.add(module_dependency(root, path))
    text = module_text(path)
    if text is None:
        return None
    return _PROJECT_MODULES.get(str(path.resolve()), text, lambda outline: ModuleCode(
        str(path), text, outline, project_root(path) if path.is_file() else None))


def torch_version(ctx: CheckedFile) -> str | None:
    """The torch version in use (e.g. ``"2.13.0"``), from the configured policy tables."""
    try:
        return ctx.policy().torch_version
    except (RuntimeError, PolicyError):
        return None


def _declared_floor(ctx: CheckedFile, newest: str) -> TorchRequirement | None:
    """The project's declared torch requirement when its floor lies below ``newest``."""
    required = ctx.torch_requirement()
    return required if required is not None and Version(required.floor) < Version(newest) else None


def gate_value(ctx: CheckedFile, test: ast.expr) -> bool | None:
    """What ``test`` (an ``if``'s condition, or a part of one that ``not``/``and``/``or``
    join) is under the torch version in use, and under the project's declared
    floor below it; None when those differ, or it does not depend only on the torch version
    (and constants)."""
    version = torch_version(ctx)
    code = checked_code(ctx) if version is not None else None
    if code is None:
        return None
    value = _Evaluator(ctx, code, version).gate(test, 0)
    if value is None:
        return None
    required = _declared_floor(ctx, version)
    if required is not None and _Evaluator(ctx, code, required.floor).gate(test, 0) is not value:
        return None  # both branches run on some torch the project supports
    return value


class _Operands:
    """The first ``count`` operands of a ``BoolOp`` joined by its operator (``a and b`` of
    ``a and b and c``): how the evaluator reads a chain one operator at a time."""

    def __init__(self, node: ast.BoolOp, count: int):
        self.node, self.count = node, count


def missing_on_supported_torch(ctx: CheckedFile, name: str) -> str | None:
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


def version_fallback(ctx: CheckedFile, node: ast.AST) -> ast.AST | None:
    """The gate that keeps ``node`` (of the file's ``ast``) from running on the torch version
    in use, or None: an ``if``/``elif``/conditional expression whose condition, so evaluated,
    leads elsewhere, or a ``try`` that uses the device-generic AMP API and whose ``except``
    around ``node`` catches what its absence raises (AttributeError, ImportError,
    ModuleNotFoundError, TypeError)."""
    version = torch_version(ctx)
    code = checked_code(ctx) if version is not None else None
    return None if code is None else _Evaluator(ctx, code, version).fallback(node, 0)


def replacement_call(deprecated: str) -> str:
    """How the torch.amp replacement of a deprecated name (``DEPRECATED_AMP``) is called:
    ``torch.amp.autocast("cuda", ...)``."""
    new_name, device = DEPRECATED_AMP[deprecated]
    device_arg = f'device_type="{device}"' if new_name.startswith("custom") else f'"{device}"'
    return f"torch.amp.{new_name}({device_arg}, ...)"


def missing_replacement(ctx: CheckedFile, deprecated: str) -> str | None:
    """Why the torch.amp replacement of a deprecated name cannot simply be used — some torch
    the project supports lacks it — and what to do instead; None when it can."""
    new_name, _ = DEPRECATED_AMP[deprecated]
    replacement = f"torch.amp.{new_name}"
    why = missing_on_supported_torch(ctx, replacement)
    if why is None:
        return None
    since = introduced_in(replacement)
    return (f"`{replacement}` needs torch {since} and {why}: keep this for older torch behind a gate "
            f"(`if hasattr(torch.amp, \"{new_name}\")`, or `try: from torch.amp import {new_name}` / "
            f"`except ImportError`), or raise the torch requirement to >={since} and use "
            f"`{replacement_call(deprecated)}`")


def _catches_missing_api(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for kind in kinds:
        parts = dotted(kind.value if isinstance(kind, ast.Starred) else kind)
        if parts is not None and parts[-1] in _MISSING_API_ERRORS:
            return True
    return False


def is_successor(name: str) -> bool:
    """Whether a qualified name is part of the device-generic AMP API (``torch.amp.*``,
    ``torch.autocast``, ``torch.GradScaler``)."""
    return name in _SUCCESSORS or name.startswith(_SUCCESSOR_PREFIXES)


def _uses_successor(code: ModuleCode, block: list[ast.AST]) -> bool:
    """Whether ``block`` (a ``try``'s body, an arm of an ``if`` or of a conditional
    expression) imports or references the device-generic AMP API."""
    if not block:
        return False
    known = code.facts.setdefault("successor blocks", {})
    if id(block[0]) not in known:
        known[id(block[0])] = any(_is_successor_use(code, node) for statement in block for node in walk(statement))
    return known[id(block[0])]


def _is_successor_use(code: ModuleCode, node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return not node.level and node.module is not None and node.names[0].name != "*" \
            and any(is_successor(f"{node.module}.{alias.name}") for alias in node.names)
    if isinstance(node, ast.Import):
        return any(is_successor(alias.name) for alias in node.names)
    return isinstance(node, (ast.Name, ast.Attribute)) and any(is_successor(q) for q in code.qualified_names(node))


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
    def __init__(self, checked: CheckedFile, code: ModuleCode, version: str, scanning: bool = False):
        self.checked = checked  # the file whose findings depend on what is read
        self.code = code
        self.version = version if version.count(".") >= 2 else version + ".0"
        # module-level names: (value, whether it depends on torch), or None: unknown
        self._names: dict[str, tuple | None] = {}
        self._unknown_reading_torch: dict[str, bool] = {}  # unknown names: whether they read torch
        self._scanning = scanning  # whether a helper it cannot finish is searched for the torch version
        self._torch = False  # whether the expression evaluated so far depends on torch

    def gate(self, test: ast.expr | _Operands, depth: int) -> bool | None:
        return self._judged(test, depth)[0]

    def reads_torch(self, test: ast.expr, depth: int) -> bool:
        """Whether ``test`` reads the torch version (``torch.__version__``, the torch
        distribution's version, torch's AMP attributes), whether or not it can be worked out:
        a test the evaluator cannot finish (a project helper that parses versions with ``re``)
        may still be a gate on it. Asked only where an answer would decide something (the
        other arm uses the device-generic API): the names in the test, and in a helper it
        cannot finish, are then worked out one by one."""
        if self._judged(test, depth)[1]:
            return True
        cache = self.code.facts.setdefault(("reads torch", self.version), {})
        hit = cache.get(id(test))
        if hit is not None and hit[0] is test:
            return hit[1]
        scanning = _Evaluator(self.checked, self.code, self.version, scanning=True)
        try:
            scanning.value(test, {}, depth)
        except _EVAL_ERRORS:
            pass
        found = scanning._torch or (not isinstance(test, _Operands) and scanning._names_torch_version(test, depth))
        if depth == 0:
            cache[id(test)] = (test, found)
        return found

    def _judged(self, test: ast.expr | _Operands, depth: int) -> tuple[bool | None, bool]:
        cache = self.code.facts.setdefault(("gates", self.version), {})
        key = (id(test.node), test.count) if isinstance(test, _Operands) else id(test)
        hit = cache.get(key)
        if hit is not None and hit[0] is (test.node if isinstance(test, _Operands) else test):
            return hit[1]
        outer, self._torch = self._torch, False
        try:
            value = _truth(self.value(test, {}, depth))
        except _EVAL_ERRORS:
            value = None
        reads_torch = self._torch
        if not reads_torch:
            value = None  # a constant, not a gate on the torch version
        self._torch = outer or self._torch
        if depth == 0:  # deeper answers may be cut short by the depth limit
            cache[key] = (test.node if isinstance(test, _Operands) else test, (value, reads_torch))
        return value, reads_torch

    def _names_torch_version(self, code: ast.AST, depth: int, local: frozenset[str] = frozenset()) -> bool:
        """Whether a name in ``code`` (a whole dotted name, not the ``torch`` of
        ``torch.cuda.is_available``; not one of ``local``) holds the torch version or torch's
        AMP API: each is worked out on its own."""
        for node in walk(code):
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load) \
                    or isinstance(self.code.parent(node), ast.Attribute):
                continue
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in local:
                continue
            outer, self._torch = self._torch, False
            try:
                value = self.value(node, {}, depth)
            except _EVAL_ERRORS:
                value = None
            reads, self._torch = self._torch, outer
            if reads and not (isinstance(value, _Api) and value.name == "torch"):
                return True
        return False

    def fallback(self, node: ast.AST, depth: int) -> ast.AST | None:
        child = node
        for ancestor in self.code.ancestors(node):
            if isinstance(ancestor, (ast.If, ast.IfExp)) and child is not ancestor.test:
                in_body = child is ancestor.body if isinstance(ancestor, ast.IfExp) \
                    else any(s is child for s in ancestor.body)
                value = self.gate(ancestor.test, depth)
                if value is (not in_body):
                    return ancestor
                if value is None and self._successor_elsewhere(ancestor, in_body) \
                        and self.reads_torch(ancestor.test, depth):
                    return ancestor
            elif isinstance(ancestor, ast.Try) and isinstance(child, ast.ExceptHandler):
                if _catches_missing_api(child) and _uses_successor(self.code, ancestor.body):
                    return ancestor
            child = ancestor
        return None

    def _successor_elsewhere(self, branch: ast.If | ast.IfExp, in_body: bool) -> bool:
        """Whether the other arm of ``branch`` uses the device-generic AMP API: a test on the
        torch version that chooses between it and the code here keeps the code for older
        torch, even where the test itself cannot be worked out."""
        other = branch.orelse if in_body else branch.body
        return _uses_successor(self.code, other if isinstance(other, list) else [other])

    def value(self, expr: ast.expr | _Operands, env: dict, depth: int):
        if depth > _DEPTH:
            raise _Unknown(expr)
        method = self._operands if type(expr) is _Operands else getattr(self, f"_{type(expr).__name__}", None)
        if method is None:
            raise _Unknown(expr)
        return method(expr, env, depth + 1)

    # -- literals ------------------------------------------------------------------------

    def _Constant(self, expr, env, depth):
        value = expr.value
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise _Unknown(expr)  # bytes, complex, Ellipsis

    def _JoinedStr(self, expr, env, depth):
        text = []
        for part in expr.values:
            if isinstance(part, ast.Constant):
                text.append(part.value)
            elif part.conversion == -1 and part.format_spec is None:
                text.append(str(self.value(part.value, env, depth)))
            else:
                raise _Unknown(part)
        return "".join(text)

    def _Tuple(self, expr, env, depth):
        return tuple(self._elements(expr.elts, env, depth))

    def _List(self, expr, env, depth):
        return list(self._elements(expr.elts, env, depth))

    def _elements(self, elements, env, depth):
        for element in elements:
            if isinstance(element, ast.Starred):
                yield from self.value(element.value, env, depth)
            else:
                yield self.value(element, env, depth)

    # -- operators -----------------------------------------------------------------------

    def _UnaryOp(self, expr, env, depth):
        if isinstance(expr.op, ast.Not):
            # `not` of something unknown is unknown
            return not _truth(self.value(expr.operand, env, depth))
        if isinstance(expr.op, ast.USub):
            return -self.value(expr.operand, env, depth)
        raise _Unknown(expr)

    def _BoolOp(self, expr, env, depth):
        return self._operands(_Operands(expr, len(expr.values)), env, depth)

    def _operands(self, prefix, env, depth):
        """Its operands joined left to right, ``(a and b) and c``, each join three-valued:
        `unknown and False` is False, `unknown or True` is True."""
        operands, count = prefix.node.values, prefix.count
        conjunction = isinstance(prefix.node.op, ast.And)
        left_operand = operands[0] if count == 2 else _Operands(prefix.node, count - 1)
        try:
            left = self.value(left_operand, env, depth)
            decided = _truth(left)
        except _EVAL_ERRORS:
            right = _truth(self.value(operands[count - 1], env, depth))
            if conjunction and not right:
                return False
            if not conjunction and right:
                return True
            raise
        if conjunction:
            return self.value(operands[count - 1], env, depth) if decided else left
        return left if decided else self.value(operands[count - 1], env, depth)

    def _Compare(self, expr, env, depth):
        left = self.value(expr.left, env, depth)
        for operator, comparator in zip(expr.ops, expr.comparators):
            right = self.value(comparator, env, depth)
            if not _compare(operator, left, right):
                return False
            left = right
        return True

    def _BinOp(self, expr, env, depth):
        left, right = self.value(expr.left, env, depth), self.value(expr.right, env, depth)
        if isinstance(expr.op, ast.Add):  # `(2, 4) + extra`, `prefix + "2.4"`
            return left + right
        raise _Unknown(expr)

    def _IfExp(self, expr, env, depth):
        taken = expr.body if _truth(self.value(expr.test, env, depth)) else expr.orelse
        return self.value(taken, env, depth)

    def _Subscript(self, expr, env, depth):
        value = self.value(expr.value, env, depth)
        index = expr.slice
        if isinstance(index, ast.Slice):
            bounds = [None if part is None else self.value(part, env, depth)
                      for part in (index.lower, index.upper, index.step)]
            return value[slice(*bounds)]
        return value[self.value(index, env, depth)]

    # -- names, attributes and calls -------------------------------------------------------

    def _Name(self, expr, env, depth):
        if expr.id in env:
            return env[expr.id]
        imported = self._imported(expr)
        if imported is not None:
            return imported
        if self._local_to_function(expr):
            raise _Unknown(expr)
        if expr.id in _BUILTIN_VALUES and expr.id not in _module_bindings(self.code):
            return _BUILTIN_VALUES[expr.id]
        return self._module_name(expr.id, depth)

    def _Attribute(self, expr, env, depth):
        imported = self._imported(expr)
        if imported is not None:
            return imported
        elsewhere = self._imported_from_project(expr)
        if elsewhere is not None:
            other, name = elsewhere
            return self._asking(other, lambda: other._module_name(name, depth))
        if dotted(expr) is not None and self.code.qualified_names(expr):
            raise _Unknown(expr)  # some other imported thing
        value = self.value(expr.value, env, depth)
        name = expr.attr
        if isinstance(value, Version) and name in ("release", "major", "minor", "micro", "base_version"):
            return getattr(value, name)
        if isinstance(value, _Api):
            return self._attribute_of(value, name)
        raise _Unknown(expr)

    def _imported(self, expr):
        """The value of an imported name (``torch.__version__``, ``torch.amp``), or None."""
        for name in self.code.qualified_names(expr):
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
        if any(isinstance(a, ast.Starred) for a in expr.args) or any(k.arg is None for k in expr.keywords):
            raise _Unknown(expr)
        if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and _TORCH_DISTRIBUTION.fullmatch(a.value)
               for a in (*expr.args, *(k.value for k in expr.keywords))):
            self._torch = True  # asks about the installed torch: `compare_version("torch", operator.ge, "2.4")`
        names = self.code.qualified_names(expr.func)
        positional = [self.value(a, env, depth) for a in expr.args]
        keywords = {k.arg: self.value(k.value, env, depth) for k in expr.keywords}
        if names & _VERSION_TYPES and len(positional) == 1 and not keywords:
            return Version(str(positional[0]))
        if names & _DISTRIBUTION_VERSION and positional == ["torch"]:
            self._torch = True
            return self.version
        if isinstance(expr.func, ast.Name) and expr.func.id in env:
            raise _Unknown(expr)
        elsewhere = self._imported_from_project(expr.func)
        if elsewhere is not None:  # a helper of another module: `utils.torch_at_least("2.4")`
            other, name = elsewhere
            return self._asking(other, lambda: other._helper(name, positional, keywords, depth))
        if isinstance(expr.func, ast.Name) and not names:
            builtin = self._builtin(expr, positional, keywords)
            if builtin is not _NOT_BUILTIN:
                return builtin
            return self._helper(expr.func.id, positional, keywords, depth)
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in _STR_METHODS and not keywords:
            owner = self.value(expr.func.value, env, depth)
            if isinstance(owner, str):
                return getattr(str(owner), expr.func.attr)(*positional)
        raise _Unknown(expr)

    def _builtin(self, expr, positional, keywords):
        name = expr.func.id
        if name in _module_bindings(self.code):
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
        if len(expr.generators) != 1:
            raise _Unknown(expr)
        loop = expr.generators[0]
        if loop.ifs or not isinstance(loop.target, ast.Name) or loop.is_async:
            raise _Unknown(expr)
        items = self.value(loop.iter, env, depth)
        return [self.value(expr.elt, {**env, loop.target.id: item}, depth) for item in items]

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
                self._unknown_reading_torch[name] = self._torch
            self._torch = outer
        found = self._names[name]
        if found is None:
            self._torch = self._torch or self._unknown_reading_torch.get(name, False)
            raise _Unknown(name)
        self._torch = self._torch or found[1]
        return found[0]

    def _assigned_value(self, name: str, depth: int):
        values = []
        bindings = _module_bindings(self.code).get(name, ())
        for binding in bindings:
            if self.fallback(binding, depth) is not None:
                self._torch = True  # which binding runs depends on torch
                continue
            if self._in_handler_of_binding_try(binding, bindings):
                continue  # runs only when the `try` that binds the name failed
            if isinstance(binding, ast.alias) and isinstance(self.code.parent(binding), ast.ImportFrom):
                values.append(self._imported_value(self.code.parent(binding), binding, depth))
                continue
            if not isinstance(binding, (ast.Assign, ast.AnnAssign)):
                raise _Unknown(name)
            values.append(self.value(binding.value, {}, depth))
        if not values or any(v != values[0] or type(v) is not type(values[0]) for v in values):
            raise _Unknown(name)
        return values[0]

    def _in_handler_of_binding_try(self, binding: ast.AST, bindings) -> bool:
        """Whether ``binding`` sits in an ``except`` of a ``try`` whose body binds the same
        name: what the name holds when the body ran (``_torch_version = Version(torch.__version__)``
        beside ``except Exception: _torch_version = Version("0.0.0")``)."""
        child = binding
        for ancestor in self.code.ancestors(binding):
            if isinstance(ancestor, ast.Try) and isinstance(child, ast.ExceptHandler):
                return any(other is not binding and contains(statement, other)
                           for other in bindings for statement in ancestor.body)
            child = ancestor
        return False

    def _imported_value(self, statement: ast.ImportFrom, alias: ast.alias, depth: int):
        """A name imported from another module of the project: its value there."""
        other = _project_module(self.checked, self.code, statement.module, statement.level)
        if other is None:
            raise _Unknown(alias)
        evaluator = self._of(other)
        return self._asking(evaluator, lambda: evaluator._module_name(alias.name, depth))

    def _imported_from_project(self, expr: ast.expr) -> "tuple[_Evaluator, str] | None":
        """The module of the project ``expr`` (``torch_at_least``, ``utils.TORCH_GE``) is
        imported from, as an evaluator of that module, and its name there; None for anything
        else."""
        for module, level, name in imported_as(expr, self.code.qualified_names(expr), self.code.in_order(ast.ImportFrom)):
            other = _project_module(self.checked, self.code, module, level)
            if other is not None:
                return self._of(other), name
        return None

    def _of(self, code: ModuleCode) -> "_Evaluator":
        """An evaluator of another module, for the same torch version and search."""
        return _Evaluator(self.checked, code, self.version, self._scanning)

    def _asking(self, other: "_Evaluator", question):
        """``question``'s answer, asked of another module's evaluator: the gate depends on
        torch if that answer does."""
        try:
            return question()
        finally:
            self._torch = self._torch or other._torch
            self.checked.dependencies |= other.code.read

    def _local_to_function(self, name: ast.Name) -> bool:
        return any(isinstance(scope, _FUNCTIONS) and name.id in _function_locals(self.code, scope)
                   for scope in self.code.scopes_around(name))

    def _helper(self, name: str, positional: list, keywords: dict, depth: int):
        """Call a module-level function of assignments, ``if`` and ``return`` with the values
        of its arguments."""
        bindings = _module_bindings(self.code).get(name, [])
        if len(bindings) != 1 or not isinstance(bindings[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise _Unknown(name)
        function = bindings[0]
        params = function.args
        if params.vararg is not None or params.kwarg is not None or params.posonlyargs or params.kwonlyargs:
            raise _Unknown(name)
        if len(positional) > len(params.args):
            raise _Unknown(name)
        defaults = [None] * (len(params.args) - len(params.defaults)) + list(params.defaults)
        local = {}
        for i, (param, default) in enumerate(zip(params.args, defaults)):
            key = param.arg
            if i < len(positional):
                local[key] = positional[i]
            elif key in keywords:
                local[key] = keywords.pop(key)
            elif default is not None:
                local[key] = self.value(default, {}, depth)
            else:
                raise _Unknown(name)
        if keywords:
            raise _Unknown(name)
        if not self.code.on_own_line(function.body[0]):
            raise _Unknown(name)  # `def f(): return x`: its body is not read as a block
        try:
            returned = self._run(function.body, local, depth)
        except _EVAL_ERRORS:
            # a helper it cannot finish may still compare the torch version
            if self._scanning and self._names_torch_version(function, depth, _function_locals(self.code, function)):
                self._torch = True
            raise
        if returned is _FELL_THROUGH:
            return None
        return returned

    def _run(self, statements: list[ast.stmt], local: dict, depth: int):
        for statement in statements:
            if isinstance(statement, ast.If):
                branch = statement.body if _truth(self.value(statement.test, local, depth)) else statement.orelse
                if branch and not self.code.on_own_line(branch[0]):  # an `elif` starts its line
                    raise _Unknown(statement)  # `if x: return y` on one line
                returned = self._run(branch, local, depth)
                if returned is not _FELL_THROUGH:
                    return returned
                continue
            if isinstance(statement, ast.Return):
                return None if statement.value is None else self.value(statement.value, local, depth)
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name):
                local[statement.targets[0].id] = self.value(statement.value, local, depth)
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
                    and isinstance(statement.value.value, (str, bytes)):
                continue  # a docstring
            elif isinstance(statement, ast.Global):
                continue  # an assignment after it would be local here: taken as one
            elif not isinstance(statement, ast.Pass):
                raise _Unknown(statement)
        return _FELL_THROUGH


# The torch distribution named as a string, alone or with a version requirement ("torch>=2.4").
_TORCH_DISTRIBUTION = re.compile(r"torch\s*(?:[<>=!~]=?\s*[\w.*+]+\s*,?\s*)*")
_NOT_BUILTIN = object()
_BUILTIN_VALUES = {"int": int, "float": float, "str": str, "tuple": tuple, "list": list, "len": len,
                   "bool": bool}
_FELL_THROUGH = object()


def _compare(operator, left, right) -> bool:
    if isinstance(operator, ast.Is):
        if right is None or left is None:
            return left is right
        raise _Unknown(operator)
    if isinstance(operator, ast.IsNot):
        if right is None or left is None:
            return left is not right
        raise _Unknown(operator)
    if isinstance(left, _Api) or isinstance(right, _Api):
        raise _Unknown(operator)
    if isinstance(operator, ast.Eq):
        return left == right
    if isinstance(operator, ast.NotEq):
        return left != right
    if isinstance(operator, ast.Lt):
        return left < right
    if isinstance(operator, ast.LtE):
        return left <= right
    if isinstance(operator, ast.Gt):
        return left > right
    if isinstance(operator, ast.GtE):
        return left >= right
    if isinstance(operator, ast.In):
        return left in right
    if isinstance(operator, ast.NotIn):
        return left not in right
    raise _Unknown(operator)


def _bindings(code: ModuleCode) -> Iterator[tuple[ast.AST, set[str]]]:
    """Every statement or node that binds names, with the names: assignments (the ``Assign``,
    once for each target), augmented and annotated ones, loops, ``as`` names (the ``with``
    item, the ``except`` handler), imports, defs and classes."""
    for node in code.nodes(ast.Assign):
        for target in node.targets:
            yield node, _target_names(target)
    for node in code.nodes(ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr):
        yield node, _target_names(node.target)
    for node in code.nodes(ast.comprehension):  # which has no position: its target stands for it
        yield node.target, _target_names(node.target)
    for node in code.nodes(ast.AnnAssign):
        if node.value is not None:
            yield node, _target_names(node.target)
    for node in code.nodes(ast.withitem):  # likewise
        if node.optional_vars is not None:
            yield node.optional_vars, _target_names(node.optional_vars)
    for node in code.nodes(ast.ExceptHandler):
        if node.name:
            yield node, {node.name}
    for node in code.nodes(ast.alias):
        if node.name != "*":
            yield node, {node.asname or node.name.split(".")[0]}
    for node in code.nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
        yield node, {node.name}


def _module_bindings(code: ModuleCode) -> dict[str, list[ast.AST]]:
    """What binds each module-level name: the bindings outside functions, classes and
    comprehensions, and every function that declares the name ``global`` and binds it."""
    found = code.facts.get("module bindings")
    if found is None:
        found = {}
        bound_in: dict[int, set[str]] = {}  # by function: the names bound in its body
        for node, names in _bindings(code):
            scopes = code.scopes_around(node)
            if not scopes:
                for name in names:
                    found.setdefault(name, []).append(node)
            function = next((a for a in scopes if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
            if function is not None:
                bound_in.setdefault(id(function), set()).update(names)
        for declaration in code.nodes(ast.Global):
            function = next((a for a in code.scopes_around(declaration)
                             if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
            for name in declaration.names if function is not None else ():
                if name in bound_in.get(id(function), ()):
                    found.setdefault(name, []).append(function)
        code.facts["module bindings"] = found
    return found


def _target_names(target: ast.AST) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(e) for e in target.elts))
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _function_locals(code: ModuleCode, function: ast.AST) -> frozenset[str]:
    """The names that may be local to ``function``: its parameters and what its body binds
    (nested scopes included, to err on the side of unknown), less those declared ``global``."""
    by_function = code.facts.get("function locals")
    if by_function is None:
        bound: dict[int, set[str]] = {}
        declared: dict[int, set[str]] = {}
        for node, names in _bindings(code):
            for scope in code.scopes_around(node):
                if isinstance(scope, _FUNCTIONS):
                    bound.setdefault(id(scope), set()).update(names)
        for param in code.nodes(ast.arg):
            for scope in code.scopes_around(param):
                if isinstance(scope, _FUNCTIONS):
                    bound.setdefault(id(scope), set()).add(param.arg)
        for declaration in code.nodes(ast.Global):
            function = next((a for a in code.scopes_around(declaration)
                             if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
            if function is not None:
                declared.setdefault(id(function), set()).update(declaration.names)
        by_function = code.facts["function locals"] = {
            key: frozenset(names - declared.get(key, set())) for key, names in bound.items()}
    return by_function.get(id(function), frozenset())
