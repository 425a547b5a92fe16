from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Edit, Fix
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import bind, has_star_args, subtree
from ..engine.version_gates import introduced_in, is_successor, missing_on_supported_torch, version_fallback

# qualified name -> (name in torch.amp, device)
_DEPRECATED = {}
for _device in ("cuda", "cpu"):
    for _name, _modules in (("autocast", ("", "autocast_mode.")), ("GradScaler", ("", "grad_scaler.")),
                            ("custom_fwd", ("", "autocast_mode.")), ("custom_bwd", ("", "autocast_mode."))):
        for _module in _modules:
            _DEPRECATED[f"torch.{_device}.amp.{_module}{_name}"] = (_name, _device)
_NEW_API = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}
_DEPRECATED_SINCE = "2.4"  # the torch release that deprecated them

# Old positional parameters, mapped to keywords of the torch.amp equivalent.
_OLD_PARAMS = {
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "GradScaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
    "custom_fwd": ("fwd",),
    "custom_bwd": ("bwd",),
}


def _root(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr.value}" if inner else None
    return None


def _is_attr_name(ctx: FileContext, node: cst.CSTNode) -> bool:
    """`autocast` in `x.autocast` does not refer to a name `autocast`."""
    parent = ctx.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr is node


def _shown(target: str) -> str:
    new_name, device = _DEPRECATED[target]
    device_arg = f'device_type="{device}"' if new_name.startswith("custom") else f'"{device}"'
    return f"torch.amp.{new_name}({device_arg}, ...)"


def _unavailable(ctx: FileContext, target: str) -> str | None:
    """Why the replacement of ``target`` cannot simply be used — some torch the project supports
    lacks it — and what to do instead; None when it can."""
    new_name, _ = _DEPRECATED[target]
    replacement = f"torch.amp.{new_name}"
    why = missing_on_supported_torch(ctx, replacement)
    if why is None:
        return None
    since = introduced_in(replacement)
    return (f"`{replacement}` needs torch {since} and {why}: keep this for older torch behind a gate "
            f"(`if hasattr(torch.amp, \"{new_name}\")`, or `try: from torch.amp import {new_name}` / "
            f"`except ImportError`), or raise the torch requirement to >={since} and use `{_shown(target)}`")


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _scope(ctx: FileContext, node: cst.CSTNode) -> cst.CSTNode:
    return next((a for a in ctx.ancestors(node) if isinstance(a, _SCOPES)), ctx.module)


def _name_imports(ctx: FileContext) -> dict[int, tuple[cst.ImportFrom, dict[str, str]]]:
    """`from torch.cuda.amp import autocast as ac`-like statements: id -> (statement, the
    deprecated names it binds, local name -> qualified name)."""
    found = {}
    for stmt in ctx.nodes(cst.ImportFrom):
        if stmt.relative or stmt.module is None or isinstance(stmt.names, cst.ImportStar):
            continue
        module = _dotted(stmt.module)
        targets = {alias.evaluated_alias or alias.evaluated_name: f"{module}.{alias.evaluated_name}"
                   for alias in stmt.names if f"{module}.{alias.evaluated_name}" in _DEPRECATED}
        if targets:
            found[id(stmt)] = (stmt, targets)
    return found


def _importing_statement(ctx: FileContext, ref: cst.Name, target: str, name_imports) -> cst.ImportFrom | None:
    """The `from ... import` of a deprecated name that ``ref`` uses: of those binding its name,
    the one in the innermost scope around it."""
    candidates = [stmt for stmt, targets in name_imports.values() if targets.get(ref.value) == target]
    if candidates:
        for scope in [a for a in ctx.ancestors(ref) if isinstance(a, _SCOPES)] + [ctx.module]:
            for stmt in candidates:
                if _scope(ctx, stmt) is scope:
                    return stmt
    return None


def _type_check(ctx: FileContext, ref: cst.CSTNode) -> cst.BaseExpression | None:
    """The classes of the `isinstance`/`issubclass` call or `except` clause that ``ref`` is one
    of (in a tuple, a concatenation of tuples or a conditional expression), or None."""
    node = ref
    for parent in ctx.ancestors(ref):
        if isinstance(parent, cst.Arg):
            call = ctx.parent(parent)
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) \
                    and call.func.value in ("isinstance", "issubclass") \
                    and len(call.args) == 2 and call.args[1] is parent:
                return parent.value
            return None
        if isinstance(parent, cst.ExceptHandler):
            return node if parent.type is node else None
        if not isinstance(parent, (cst.Tuple, cst.Element, cst.BinaryOperation, cst.IfExp)):
            return None
        node = parent
    return None


def _compat_reference(ctx: FileContext, ref: cst.CSTNode) -> bool:
    """A reference that calls nothing and accepts the torch.amp API as well: an annotation, or
    a type check whose classes also include a torch.amp one (the old classes subclass them)."""
    if any(isinstance(a, cst.Annotation) for a in ctx.ancestors(ref)):
        return True
    classes = _type_check(ctx, ref)
    return classes is not None and any(
        is_successor(q) for n in subtree(classes) if isinstance(n, (cst.Name, cst.Attribute))
        for q in ctx.qualified_names(n))


class DeprecatedAmpApi(Rule):
    """
    ## What it does
    Finds the deprecated per-device AMP API — `torch.cuda.amp.autocast`,
    `torch.cpu.amp.autocast`, `torch.cuda.amp.GradScaler`, `torch.cpu.amp.GradScaler`,
    `torch.cuda.amp.custom_fwd` / `custom_bwd` — in any spelling: `import torch as th`,
    `from torch.cuda.amp import autocast as ac`, `from torch.cuda import amp`.

    An import of the deprecated names themselves (`from torch.cuda.amp import autocast,
    GradScaler`) is reported once, at the import, with the lines of their uses; a
    module-qualified use (`torch.cuda.amp.autocast(...)`, `amp.autocast()` after
    `from torch.cuda import amp`) is reported where it is.

    Not reported: version-gated fallbacks, code that only older torch runs, where the torch.amp
    API is missing or not yet deprecated — the `else`/`elif` branch of a condition on the torch
    version (`if version.parse(torch.__version__) >= version.parse("2.4")`, a module-level flag
    or helper function computing one, `hasattr(torch.amp, "custom_fwd")`, in the file or
    imported from another module of the project) evaluated for the configured
    `torch-version`, and an `except AttributeError/ImportError/TypeError` handler
    around a use of torch.amp. Nor references that call nothing and accept the torch.amp
    classes as well: annotations, and `isinstance`/`issubclass`/`except` classes that include
    a torch.amp one (the deprecated classes subclass them). A type check on a deprecated
    class alone is reported: it rejects `torch.amp.GradScaler("cuda")`.

    Nor, when `torch-version` is not configured, the files of a project that caps torch below
    2.4 — no torch it can be installed with deprecates the API, and the replacement may not
    exist there: every declaration of torch the project makes admits no release from 2.4 on
    (`torch<2.3,>=2.1`, `torch<=2.3.1`, `torch==2.1.*`, `torch~=2.3.0`; not `torch~=2.3`,
    which admits 2.9). The declarations are read at the project's root (`pyproject.toml`
    dependencies and optional groups, `requirements*.txt`, `setup.cfg`, `setup.py`) and, for
    an installed package (a package folder in a site-packages or `pip install --target`
    folder), from the `Requires-Dist` lines of the `METADATA` of the `*.dist-info` beside it
    that lists it (its `top_level.txt` or `RECORD`), leaving out those of an extra only. One
    declaration without an upper bound (a bare `torch` in `requirements-dev.txt`) admits every
    newer torch: the project is then reported.

    ## Why is this bad?
    PyTorch deprecated them in 2.4 in favour of `torch.amp.autocast(device_type, ...)`,
    `torch.amp.GradScaler(device, ...)` and `torch.amp.custom_fwd(device_type=...)`; each call
    warns (`FutureWarning`), and they will be removed.

    ## Example
    ```python
    from torch.cuda.amp import GradScaler, autocast
    scaler = GradScaler(2.0**14)
    with autocast(False):
        ...
    ```

    ## Fix
    ```python
    from torch.amp import GradScaler, autocast
    scaler = GradScaler("cuda", init_scale=2.0**14)
    with autocast("cuda", enabled=False):
        ...
    ```

    ## Fix safety
    Safe. The signatures differ (`torch.cuda.amp.autocast(enabled, dtype, cache_enabled)` but
    `torch.amp.autocast(device_type, dtype, enabled, cache_enabled)`), so positional arguments
    are rewritten as keywords: `autocast(False)` becomes `autocast("cuda", enabled=False)`,
    never `("cuda", False)`. The import statement is rewritten together with every use of the
    names it binds, or not at all. No fix for a call with `*args`/`**kwargs`, for a reference
    that is not called (`ctx = autocast`, a type check on the old class alone), when a name
    from the deprecated import is used in any other way, or when one of its uses is a
    version-gated fallback (the fix never rewrites one). The fixed code needs a torch that
    has the torch.amp API (`autocast` 1.12, `GradScaler` 2.3, `custom_fwd` / `custom_bwd` with
    `device_type=` 2.4). So when `torch-version` is not configured and the project declares a
    lower torch (`torch>=2.1` in its `pyproject.toml` dependencies or optional groups,
    `requirements*.txt`, `setup.cfg`, `setup.py`), a name whose replacement that torch lacks
    gets no fix and no torch.amp advice: the message names the declaration and says to keep
    the old API behind a gate (`hasattr(torch.amp, "GradScaler")`, `try: from torch.amp import
    GradScaler` / `except ImportError`), or to raise the requirement. A configured
    `torch-version` takes precedence over the declaration.

    ## False positives
    A fallback whose condition cannot be evaluated in the file — a flag or helper imported from
    another module, a condition that is not about the torch version — is reported as if it ran.
    So is the code of a project that caps torch below 2.4 where amplint does not read it: in a
    conda `environment.yml`, a constraints file, a lock file, a `requirements*.txt` outside the
    project's root, the metadata of an installed single module (no package folder), or only
    under an extra of an installed distribution.
    """

    code = "AMP004"
    name = "deprecated-amp-api"
    summary = "Deprecated torch.cuda.amp / torch.cpu.amp API"
    fixable = True
    fragments = (r"(?:cuda|cpu)\.amp\b", r"from\s+torch\.(?:cuda|cpu)\s+import[^\n]*\bamp\b")
    # A use, not a mention in a comment or a docstring (nor an unused import).
    may_fire = staticmethod(lambda outline: outline.refers_to(_DEPRECATED.keys()))

    valid = (
        Valid("""
import torch
scaler = torch.amp.GradScaler("cuda")
with torch.amp.autocast("cuda", dtype=torch.float16):
    out = model(x)
"""),
        Valid("""
from torch.amp import autocast, custom_fwd
class F(torch.autograd.Function):
    @staticmethod
    @custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x
"""),
        # Version-gated fallbacks: the else of a gate on the version, an except handler
        # around torch.amp, the dead side of a conditional expression.
        Valid("""
import torch
from typing import TYPE_CHECKING
from packaging import version
def torch_version():
    return torch.__version__.partition("+")[0]
def torch_version_ge(major, minor, patch=None):
    _version = version.parse(torch_version())
    if patch is None:
        return _version >= version.parse(f"{major}.{minor}")
    return _version >= version.parse(f"{major}.{minor}.{patch}")
if TYPE_CHECKING:
    autocast = None
elif torch_version_ge(2, 4):
    autocast = torch.amp.autocast
else:
    autocast = torch.cuda.amp.autocast
TORCH_GE_2_4 = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
ctx = torch.amp.autocast("cuda") if TORCH_GE_2_4 else torch.cuda.amp.autocast()
"""),
        Valid("""
try:
    from torch.amp import GradScaler, autocast
    DEPRECATED_AMP = False
except ImportError:
    from torch.cuda.amp import GradScaler, autocast
    DEPRECATED_AMP = True
if DEPRECATED_AMP:
    scaler = GradScaler(enabled=use_amp)
else:
    scaler = GradScaler("cuda", enabled=use_amp)
"""),
        Valid("""
import torch
from functools import partial
def amp_custom_fwd(cast_inputs=None):
    try:
        return partial(torch.amp.custom_fwd, device_type="cuda", cast_inputs=cast_inputs)
    except AttributeError:
        return partial(torch.cuda.amp.custom_fwd, cast_inputs=cast_inputs)
"""),
        Valid("""
import torch
from packaging import version
torch_version = torch.__version__.split("+")[0]
if version.parse(torch_version) >= version.parse("2.3.0"):
    from torch.amp import GradScaler as TorchGradScaler
else:
    from torch.cuda.amp import GradScaler as TorchGradScaler
class GradScaler(TorchGradScaler):
    pass
"""),
        # A project that caps torch below 2.4: the API is deprecated on no torch it admits.
        Valid("""
import torch
scaler = torch.cuda.amp.GradScaler()
with torch.cuda.amp.autocast():
    loss = model(x)
""", project=(("requirements.txt", "numpy\ntorch>=2.1,<2.3  # the torch.amp GradScaler is 2.3's\n"),)),
        # References that call nothing and accept the torch.amp class too; probes that only
        # ask whether the old module exists.
        Valid("""
import torch
from torch.amp import GradScaler
from torch.cuda.amp import GradScaler as CudaGradScaler
def attach(scaler: torch.cuda.amp.GradScaler):
    assert isinstance(scaler, (torch.cuda.amp.GradScaler, torch.amp.GradScaler))
    assert isinstance(scaler, (CudaGradScaler, GradScaler))
def amp_available():
    try:
        import torch.cuda.amp as amp
        return hasattr(torch.cuda.amp, "autocast")
    except ModuleNotFoundError:
        return False
"""),
    )
    invalid = (
        Invalid("""
import torch
scaler = torch.cuda.amp.GradScaler(init_scale=2.0**14, enabled=use_amp)
with torch.cuda.amp.autocast(False):
    out = model(x)
with torch.cpu.amp.autocast(dtype=torch.bfloat16):
    out = model(x)
""", fixed="""
import torch
scaler = torch.amp.GradScaler("cuda", init_scale=2.0**14, enabled=use_amp)
with torch.amp.autocast("cuda", enabled=False):
    out = model(x)
with torch.amp.autocast("cpu", dtype=torch.bfloat16):
    out = model(x)
""", at=((3, 10, '`torch.cuda.amp.GradScaler` is deprecated (torch.cuda.amp.Gr'), (4, 6, '`torch.cuda.amp.autocast` is deprecated (torch.cuda.amp.auto'), (6, 6, '`torch.cpu.amp.autocast` is deprecated (torch.cpu.amp.autoca'),)),
        Invalid("""
from torch.cuda.amp import GradScaler, autocast as ac
scaler = GradScaler(1024.0)
with ac(use_amp, torch.float16):
    out = model(x)
""", fixed="""
from torch.amp import GradScaler, autocast as ac
scaler = GradScaler("cuda", init_scale=1024.0)
with ac("cuda", enabled=use_amp, dtype=torch.float16):
    out = model(x)
""", at=((2, 1, 'deprecated torch.cuda.amp.GradScaler, torch.cuda.amp.autocast (used at lines 3, 4)'),)),
        # Used as decorators: custom_fwd/custom_bwd take the device as a keyword.
        Invalid("""
import torch
from torch.cuda.amp import custom_fwd, custom_bwd
class Fn(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, x):
        return x

    @staticmethod
    @custom_bwd
    def backward(ctx, g):
        return g
""", fixed="""
import torch
from torch.amp import custom_fwd, custom_bwd
class Fn(torch.autograd.Function):
    @staticmethod
    @custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x

    @staticmethod
    @custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g
""", at=((3, 1, '(used at lines 6, 11): import from `torch.amp`'),)),
        Invalid("""
import torch
from torch.cuda import amp
class Fn(torch.autograd.Function):
    @staticmethod
    @amp.custom_fwd
    def forward(ctx, x):
        return x

    @staticmethod
    @amp.custom_bwd
    def backward(ctx, g):
        return g
with amp.autocast():
    y = Fn.apply(x)
""", fixed="""
import torch
from torch import amp
class Fn(torch.autograd.Function):
    @staticmethod
    @amp.custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x

    @staticmethod
    @amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        return g
with amp.autocast("cuda"):
    y = Fn.apply(x)
""", at=((6, 6, '`amp.custom_fwd` is deprecated (torch.cuda.amp.custom_fwd)'), (11, 6, '`amp.custom_bwd` is deprecated (torch.cuda.amp.custom_bwd)'), (14, 6, '`amp.autocast` is deprecated (torch.cuda.amp.autocast)'),)),
        Invalid("""
import torch as th
@th.cuda.amp.custom_fwd(cast_inputs=th.float32)
def fused(x):
    return x
""", fixed="""
import torch as th
@th.amp.custom_fwd(device_type="cuda", cast_inputs=th.float32)
def fused(x):
    return x
""", at=((3, 2, '`th.cuda.amp.custom_fwd` is deprecated (torch.cuda.amp.custo'),)),
        # The imported name is also passed around uncalled: no fix for any of its uses.
        Invalid("""
from torch.cuda.amp import autocast
ctx_factory = autocast if use_amp else nullcontext
with autocast():
    out = model(x)
""", at=((2, 1, 'torch.cuda.amp.autocast (used at lines 3, 4)'),)),
        # The branch that runs on the torch version in use: always, this torch has the attribute.
        Invalid("""
import torch
if torch.cuda.is_available() and hasattr(torch.cuda.amp, "autocast"):
    autocast = torch.cuda.amp.autocast
def fwd_decorator(f):
    if hasattr(torch.cuda.amp, "custom_fwd"):
        return torch.cuda.amp.custom_fwd(f)
    return f
""", fixed="""
import torch
if torch.cuda.is_available() and hasattr(torch.cuda.amp, "autocast"):
    autocast = torch.cuda.amp.autocast
def fwd_decorator(f):
    if hasattr(torch.cuda.amp, "custom_fwd"):
        return torch.amp.custom_fwd(f, device_type="cuda")
    return f
""", at=((4, 16, '`torch.cuda.amp.autocast` is deprecated'), (7, 16, '`torch.cuda.amp.custom_fwd` is deprecated'),)),
        Invalid("""
import torch
from packaging.version import parse as V
if V(torch.__version__) >= V("1.6.0"):
    from torch.cuda.amp import autocast
else:
    from contextlib import contextmanager
    @contextmanager
    def autocast(enabled=True):
        yield
with autocast():
    out = model(x)
""", fixed="""
import torch
from packaging.version import parse as V
if V(torch.__version__) >= V("1.6.0"):
    from torch.amp import autocast
else:
    from contextlib import contextmanager
    @contextmanager
    def autocast(enabled=True):
        yield
with autocast("cuda"):
    out = model(x)
""", at=((5, 5, 'torch.cuda.amp.autocast (used at line 11)'),)),
        # One use is a fallback for older torch, which the fix would rewrite too: no fix.
        Invalid("""
import torch
from torch.cuda.amp import GradScaler
NEW_SCALER = hasattr(torch.amp, "GradScaler")
scaler = torch.amp.GradScaler("cuda") if NEW_SCALER else GradScaler()
other = GradScaler()
""", at=((3, 1, 'torch.cuda.amp.GradScaler (used at line 6)'),)),
        # A type check on the old class alone rejects torch.amp.GradScaler("cuda"); the
        # annotation calls nothing.
        Invalid("""
import torch
def attach(scaler: torch.cuda.amp.GradScaler):
    if not isinstance(scaler, torch.cuda.amp.GradScaler):
        raise TypeError(scaler)
""", at=((4, 31, 'a type check on it alone rejects a `torch.amp.GradScaler`'),)),
        Invalid("""
import torch
def make(args, kwargs):
    return torch.cuda.amp.GradScaler(*args, **kwargs)
""", at=((4, 12, '`torch.cuda.amp.GradScaler` is deprecated (torch.cuda.amp.Gr'),)),
    )

    def check(self, ctx: FileContext) -> None:
        required = ctx.torch_requirement(without_floor=True)
        if required is not None and not required.admits_from(_DEPRECATED_SINCE):
            return  # every torch the project admits predates the deprecation
        imports = ctx.nodes(cst.Import) + ctx.nodes(cst.ImportFrom)
        in_imports = {id(n) for imp in imports for n in subtree(imp)}
        # References outside import statements; only those that start with a name an import
        # binds to torch.cuda.amp, torch.cpu.amp or a module above them can mean them.
        leading = ctx.names_leading_to(_DEPRECATED.keys())
        references = [n for n in ctx.nodes(cst.Attribute) + ctx.nodes(cst.Name)
                      if (root := _root(n)) is not None and root.value in leading
                      and id(n) not in in_imports and not _is_attr_name(ctx, n)]
        name_imports = _name_imports(ctx)  # reported at the import, with their uses
        uses, by_import = [], {}
        for ref in references:
            parent = ctx.parent(ref)
            if isinstance(parent, cst.Attribute) and parent.value is ref:
                continue  # a prefix of a longer reference
            target = ctx.resolves_to(ref, _DEPRECATED.keys())
            if target is None:
                continue
            stmt = _importing_statement(ctx, ref, target, name_imports) if isinstance(ref, cst.Name) else None
            if stmt is not None:
                by_import.setdefault(id(stmt), []).append(ref)
            elif version_fallback(ctx, ref) is None and not _compat_reference(ctx, ref):
                uses.append((ref, target))
        bindings = self._import_bindings(imports)
        planned = [(ref, target, self._plan(ctx, ref, target, bindings)) for ref, target in uses]

        # An import rewrite is only possible if every use of the names it binds is fixable.
        broken: set[int] = set()
        for ref, target, plan in planned:
            root = _root(ref)
            binding = bindings.get(root.value) if root is not None else None
            if binding is not None and (plan is None or plan[1] is None):
                broken.add(id(binding[0]))
        # So is one whose names are also used for something else (in a fallback, say).
        deprecated_refs = {id(r) for r, _, _ in planned}
        for ref in references:
            root = _root(ref)
            if root is None or root.value not in bindings or id(ref) in deprecated_refs:
                continue
            parent = ctx.parent(ref)
            if not (isinstance(parent, cst.Attribute) and parent.value is ref):
                broken.add(id(bindings[root.value][0]))

        for ref, target, plan in planned:
            new_name, device = _DEPRECATED[target]
            unavailable = _unavailable(ctx, target)
            message = f"`{_dotted(ref) or ctx.code(ref)}` is deprecated ({target})"
            message += f": use `{_shown(target)}`" if unavailable is None else f", but {unavailable}"
            if _type_check(ctx, ref) is not None:
                message += f"; a type check on it alone rejects a `torch.amp.{new_name}`"
            fix = None
            if plan is not None:
                node, replacement, import_edit = plan
                if import_edit is None or id(import_edit[0]) not in broken:
                    edits = [ctx.replace(node, replacement)]
                    group = None
                    if import_edit is not None:
                        edits.append(import_edit[1])
                        group = f"{self.code}-import-{import_edit[1].start}"
                    fix = Fix(f"Use `{_shown(target)}`", tuple(edits), "safe", group)
            ctx.report(ref, message, fix)

        for stmt, targets in name_imports.values():
            if version_fallback(ctx, stmt) is None:
                self._check_import(ctx, stmt, targets, by_import.get(id(stmt), []), bindings)

    def _check_import(self, ctx: FileContext, stmt: cst.ImportFrom, targets: dict[str, str],
                      refs: list[cst.Name], bindings) -> None:
        """One finding for `from torch.cuda.amp import ...`, naming its uses' lines; its fix
        rewrites the import and every use together. Importing calls nothing: not reported when
        its names are unused, or used only in version-gated fallbacks or in type checks that
        also accept the torch.amp class."""
        live = [r for r in refs if version_fallback(ctx, r) is None]
        findings = [r for r in live if not _compat_reference(ctx, r)]
        if not findings:
            return
        names = ", ".join(dict.fromkeys(targets.values()))
        lines = sorted({ctx.location(ctx.offsets(r)[0]).row for r in findings})
        used = f"used at line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}"
        shown = ", ".join(f"`{_shown(t)}`" for t in dict.fromkeys(targets.values()))
        imported = ", ".join(a.evaluated_name + (f" as {a.evaluated_alias}" if a.evaluated_alias else "")
                             for a in stmt.names)
        unavailable = next(filter(None, (_unavailable(ctx, t) for t in dict.fromkeys(targets.values()))), None)
        message = f"`from {_dotted(stmt.module)} import {imported}` imports the deprecated {names} ({used})"
        message += f": import from `torch.amp` and pass the device: {shown}" if unavailable is None \
            else f", but {unavailable}"
        fix = None
        import_edit = self._import_edit(ctx, stmt, None) if unavailable is None else None
        dropped = len(live) < len(refs)  # a fallback's use would be rewritten too
        bound_once = all(bindings.get(local, (None,))[0] is stmt for local in targets)
        if import_edit is not None and not dropped and bound_once:
            edits = [import_edit]
            for ref in refs:
                if _compat_reference(ctx, ref):
                    continue  # now names the torch.amp class, which the old one subclasses
                plan = self._plan_use(ctx, ref, ctx.code(ref), targets[ref.value])
                if plan is None:
                    break
                edits.append(ctx.replace(*plan))
            else:
                fix = Fix("Import from `torch.amp` and pass the device", tuple(edits), "safe")
        ctx.report(stmt, message, fix)

    @staticmethod
    def _import_bindings(imports) -> dict[str, tuple[cst.CSTNode, cst.ImportAlias]]:
        """Local names bound by imports of torch.cuda.amp / torch.cpu.amp things; a name bound
        twice is left out (which binding a use sees is not clear)."""
        found: dict[str, tuple] = {}
        seen: set[str] = set()
        for stmt in imports:
            if isinstance(stmt.names, cst.ImportStar):
                continue
            for alias in stmt.names:
                local = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
                if local in seen:
                    found.pop(local, None)
                    continue
                seen.add(local)
                found[local] = (stmt, alias)
        return found

    def _plan(self, ctx: FileContext, ref, target, bindings):
        """(node to replace, its replacement, (import stmt, import edit) or None), or None."""
        new_name, device = _DEPRECATED[target]
        root = _root(ref)
        if root is None or _unavailable(ctx, target) is not None:
            return None
        root_names = ctx.qualified_names(root)
        if "torch" in root_names:
            dotted = _dotted(ref)
            if dotted is None or dotted.split(".")[1:3] != [device, "amp"]:
                return None
            new_ref, import_edit = f"{root.value}.amp.{new_name}", None
        else:
            binding = bindings.get(root.value)
            if binding is None:
                return None
            import_edit = self._import_edit(ctx, *binding)
            if import_edit is None:
                return None
            new_ref, import_edit = ctx.code(ref), (binding[0], import_edit)

        use = self._plan_use(ctx, ref, new_ref, target)
        return None if use is None else (*use, import_edit)

    def _plan_use(self, ctx: FileContext, ref, new_ref: str, target: str) -> tuple[cst.CSTNode, str] | None:
        """(node to replace, its replacement) for a call or a decorator, or None."""
        new_name, device = _DEPRECATED[target]
        parent = ctx.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            call = self._call(parent, new_ref, new_name, device)
            return None if call is None else (parent, ctx.module.code_for_node(call))
        if isinstance(parent, cst.Decorator) and new_name in ("custom_fwd", "custom_bwd"):
            return ref, f'{new_ref}(device_type="{device}")'
        return None

    @staticmethod
    def _call(call: cst.Call, new_ref: str, new_name: str, device: str) -> cst.Call | None:
        if has_star_args(call):
            return None
        params = _OLD_PARAMS[new_name]
        bound = bind(call, params)
        if bound is None or len([a for a in call.args if a.keyword is None]) > len(params):
            return None
        device_arg = cst.Arg(cst.SimpleString(f'"{device}"'))
        positional, keywords = [], []
        for arg in call.args:
            arg = arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)
            if arg.keyword is not None:
                keywords.append(arg)
            elif new_name in ("custom_fwd", "custom_bwd"):
                positional.append(arg)  # the decorated function stays positional
            else:
                name = next(k for k, v in bound.items() if v.value is arg.value)
                keywords.append(arg.with_changes(keyword=cst.Name(name), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        if new_name in ("custom_fwd", "custom_bwd"):
            device_arg = cst.Arg(cst.SimpleString(f'"{device}"'), keyword=cst.Name("device_type"),
                                 equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                       whitespace_after=cst.SimpleWhitespace("")))
            args = positional + [device_arg] + keywords
        else:
            args = [device_arg] + keywords
        return call.with_changes(func=cst.parse_expression(new_ref), args=args)

    @staticmethod
    def _import_edit(ctx: FileContext, stmt, alias: cst.ImportAlias | None) -> Edit | None:
        if isinstance(stmt, cst.ImportFrom):
            module = _dotted(stmt.module) if stmt.module is not None and not stmt.relative else None
            if module is None:
                return None
            parts = module.split(".")
            names = [a.evaluated_name for a in stmt.names]
            if parts[:3] in (["torch", "cuda", "amp"], ["torch", "cpu", "amp"]) and len(parts) <= 4 \
                    and all(n in _NEW_API for n in names):
                return ctx.replace(stmt.module, "torch.amp")
            if module in ("torch.cuda", "torch.cpu") and names == ["amp"]:
                return ctx.replace(stmt.module, "torch")
            return None
        if len(stmt.names) == 1 and alias.asname is not None \
                and alias.evaluated_name in ("torch.cuda.amp", "torch.cpu.amp"):
            return ctx.replace(alias.name, "torch.amp")
        return None
