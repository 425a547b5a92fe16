from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.ast_names import (AstImportResolver, dotted, file_resolver, in_annotation, single_imports,
                                type_check_classes)
from ..engine.diagnostics import Edit, Fix
from ..engine.outline import walk
from ..engine.regions import has_star_args
from ..engine.rule import Invalid, Rule, Valid
from ..engine.text_parts import call_text, name_span
from ..engine.version_gates import (
    DEPRECATED_AMP,
    DEPRECATED_SINCE,
    OLD_PARAMETERS,
    is_successor,
    missing_replacement,
    replacement_call,
    version_fallback,
)

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _root(node: ast.expr) -> ast.Name | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _scope(ctx: AstContext, node: ast.AST) -> ast.AST:
    return ctx.enclosing(node, _SCOPES) or ctx.outline.tree


def _name_imports(ctx: AstContext) -> dict[int, tuple[ast.ImportFrom, dict[str, str]]]:
    """`from torch.cuda.amp import autocast as ac`-like statements, in source order: id ->
    (statement, the deprecated names it binds, local name -> qualified name)."""
    found = {}
    for stmt in sorted(ctx.outline.nodes(ast.ImportFrom), key=ctx.order):
        if stmt.level or stmt.module is None or stmt.names[0].name == "*":
            continue
        targets = {alias.asname or alias.name: f"{stmt.module}.{alias.name}"
                   for alias in stmt.names if f"{stmt.module}.{alias.name}" in DEPRECATED_AMP}
        if targets:
            found[id(stmt)] = (stmt, targets)
    return found


def _importing_statement(ctx: AstContext, ref: ast.Name, target: str, name_imports) -> ast.ImportFrom | None:
    """The `from ... import` of a deprecated name that ``ref`` uses: of those binding its name,
    the one in the innermost scope around it."""
    candidates = [stmt for stmt, targets in name_imports.values() if targets.get(ref.id) == target]
    scope = ctx.enclosing(ref, _SCOPES) if candidates else None
    while candidates:
        found = next((stmt for stmt in candidates if _scope(ctx, stmt) is (scope or ctx.outline.tree)), None)
        if found is not None or scope is None:
            return found
        scope = ctx.enclosing(scope, _SCOPES)
    return None


def _compat_reference(ctx: AstContext, imports: AstImportResolver, ref: ast.expr) -> bool:
    """A reference that calls nothing and accepts the torch.amp API as well: an annotation, or
    a type check whose classes also include a torch.amp one (the old classes subclass them)."""
    if in_annotation(ctx.parent, ref):
        return True
    classes = type_check_classes(ctx.parent, ref)
    return classes is not None and any(
        is_successor(q) for n in walk(classes) if isinstance(n, (ast.Name, ast.Attribute))
        for q in imports.qualified_names(n))


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
    `torch-version`; a condition that reads the torch version but cannot be worked out to
    the end (a helper that parses it with `re`, another library's `compare_version("torch",
    operator.ge, "2.4")`) when its other arm uses the torch.amp API; and an `except
    AttributeError/ImportError/TypeError` handler around a use of torch.amp. Nor references that call nothing and accept the torch.amp
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

    valid = (
        # A mention in a docstring or a comment is no use.
        Valid('''"""Unlike torch.cuda.amp.autocast, this works on any device."""
import torch
scaler = torch.amp.GradScaler("cuda")  # was torch.cuda.amp.GradScaler()
with torch.amp.autocast("cuda", dtype=torch.float16):
    out = model(x)
'''),
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

    def check(self, ctx: AstContext) -> None:
        outline = ctx.outline
        star = any(isinstance(s, ast.ImportFrom) and s.names[0].name == "*" for s in outline.tree.body)
        if not star and not outline.refers_to(DEPRECATED_AMP.keys()):
            return  # a mention in a comment or a docstring, an unused import
        required = ctx.torch_requirement(without_floor=True)
        if required is not None and not required.admits_from(DEPRECATED_SINCE):
            return  # every torch the project admits predates the deprecation
        imports = file_resolver(ctx, outline)
        # Only references that start with a name an import binds to torch.cuda.amp,
        # torch.cpu.amp or a module above them can mean them.
        leading = imports.names_leading_to(DEPRECATED_AMP.keys())
        references = [n for kind in (ast.Attribute, ast.Name) for n in sorted(
            [n for n in outline.nodes(kind) if getattr(_root(n), "id", None) in leading], key=ctx.order)]
        name_imports = _name_imports(ctx)  # reported at the import, with their uses
        uses, by_import = [], {}
        for ref in references:
            parent = ctx.parent(ref)
            if isinstance(parent, ast.Attribute) and parent.value is ref:
                continue  # a prefix of a longer reference
            target = next((q for q in imports.qualified_names(ref) if q in DEPRECATED_AMP), None)
            if target is None:
                continue
            stmt = _importing_statement(ctx, ref, target, name_imports) if isinstance(ref, ast.Name) else None
            if stmt is not None:
                by_import.setdefault(id(stmt), []).append(ref)
            elif version_fallback(ctx, ref) is None and not _compat_reference(ctx, imports, ref):
                uses.append((ref, target))
        bindings = single_imports(outline.nodes(ast.Import) + outline.nodes(ast.ImportFrom))
        planned = [(ref, target, self._plan(ctx, imports, ref, target, bindings)) for ref, target in uses]

        # An import rewrite is only possible if every use of the names it binds is fixable.
        broken: set[int] = set()
        for ref, target, plan in planned:
            binding = bindings.get(_root(ref).id)
            if binding is not None and plan is None:
                broken.add(id(binding[0]))
        # So is one whose names are also used for something else (in a fallback, say).
        deprecated_refs = {id(r) for r, _, _ in planned}
        for ref in references:
            root = _root(ref)
            if root.id not in bindings or id(ref) in deprecated_refs:
                continue
            parent = ctx.parent(ref)
            if not (isinstance(parent, ast.Attribute) and parent.value is ref):
                broken.add(id(bindings[root.id][0]))

        for ref, target, plan in planned:
            new_name, device = DEPRECATED_AMP[target]
            unavailable = missing_replacement(ctx, target)
            message = f"`{'.'.join(dotted(ref))}` is deprecated ({target})"
            message += f": use `{replacement_call(target)}`" if unavailable is None else f", but {unavailable}"
            if type_check_classes(ctx.parent, ref) is not None:
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
                    fix = Fix(f"Use `{replacement_call(target)}`", tuple(edits), "safe", group)
            ctx.report(ref, message, fix)

        for stmt, targets in name_imports.values():
            if version_fallback(ctx, stmt) is None:
                self._check_import(ctx, imports, stmt, targets, by_import.get(id(stmt), []), bindings)

    def _check_import(self, ctx: AstContext, imports: AstImportResolver, stmt: ast.ImportFrom,
                      targets: dict[str, str], refs: list[ast.Name], bindings) -> None:
        """One finding for `from torch.cuda.amp import ...`, naming its uses' lines; its fix
        rewrites the import and every use together. Importing calls nothing: not reported when
        its names are unused, or used only in version-gated fallbacks or in type checks that
        also accept the torch.amp class."""
        live = [r for r in refs if version_fallback(ctx, r) is None]
        findings = [r for r in live if not _compat_reference(ctx, imports, r)]
        if not findings:
            return
        names = ", ".join(dict.fromkeys(targets.values()))
        lines = sorted({r.lineno for r in findings})
        used = f"used at line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}"
        shown = ", ".join(f"`{replacement_call(t)}`" for t in dict.fromkeys(targets.values()))
        imported = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in stmt.names)
        unavailable = next(filter(None, (missing_replacement(ctx, t) for t in dict.fromkeys(targets.values()))), None)
        message = f"`from {stmt.module} import {imported}` imports the deprecated {names} ({used})"
        message += f": import from `torch.amp` and pass the device: {shown}" if unavailable is None \
            else f", but {unavailable}"
        fix = None
        import_edit = self._import_edit(ctx, stmt, None) if unavailable is None else None
        dropped = len(live) < len(refs)  # a fallback's use would be rewritten too
        bound_once = all(bindings.get(local, (None,))[0] is stmt for local in targets)
        if import_edit is not None and not dropped and bound_once:
            edits = [import_edit]
            for ref in refs:
                if _compat_reference(ctx, imports, ref):
                    continue  # now names the torch.amp class, which the old one subclasses
                plan = self._plan_use(ctx, ref, ctx.code(ref), targets[ref.id])
                if plan is None:
                    break
                edits.append(ctx.replace(*plan))
            else:
                fix = Fix("Import from `torch.amp` and pass the device", tuple(edits), "safe")
        ctx.report(stmt, message, fix)

    def _plan(self, ctx: AstContext, imports: AstImportResolver, ref: ast.expr, target: str, bindings):
        """(node to replace, its replacement, (import stmt, import edit) or None), or None."""
        new_name, device = DEPRECATED_AMP[target]
        root = _root(ref)
        if missing_replacement(ctx, target) is not None:
            return None
        if "torch" in imports.qualified_names(root):
            if dotted(ref)[1:3] != [device, "amp"]:
                return None
            new_ref, import_edit = f"{root.id}.amp.{new_name}", None
        else:
            binding = bindings.get(root.id)
            edit = self._import_edit(ctx, *binding) if binding is not None else None
            if edit is None:
                return None
            new_ref, import_edit = ctx.code(ref), (binding[0], edit)
        use = self._plan_use(ctx, ref, new_ref, target)
        return None if use is None else (*use, import_edit)

    def _plan_use(self, ctx: AstContext, ref: ast.expr, new_ref: str, target: str) -> tuple[ast.AST, str] | None:
        """(node to replace, its replacement) for a call or a decorator, or None."""
        new_name, device = DEPRECATED_AMP[target]
        parent = ctx.parent(ref)
        if isinstance(parent, ast.Call) and parent.func is ref:
            call = self._call(ctx, parent, new_ref, new_name, device)
            return None if call is None else (parent, call)
        if isinstance(parent, _DEFINITIONS) and any(d is ref for d in parent.decorator_list) \
                and new_name in ("custom_fwd", "custom_bwd"):
            return ref, f'{new_ref}(device_type="{device}")'
        return None

    @staticmethod
    def _call(ctx: AstContext, call: ast.Call, new_ref: str, new_name: str, device: str) -> str | None:
        """The call's text with the torch.amp callee and the device, the old positional
        arguments passed by keyword, each as written."""
        params = OLD_PARAMETERS[new_name]
        if has_star_args(call) or len(call.args) > len(params):
            return None
        parts = call_text(ctx, call)
        if parts is None:
            return None
        positional, keywords = list(parts.arguments[:len(call.args)]), list(parts.arguments[len(call.args):])
        if new_name in ("custom_fwd", "custom_bwd"):  # the decorated function stays positional
            return parts.rewritten(new_ref, positional + [f'device_type="{device}"'] + keywords)
        return parts.rewritten(new_ref, [f'"{device}"'] + [f"{p}={t}" for p, t in zip(params, positional)] + keywords)

    @staticmethod
    def _import_edit(ctx: AstContext, stmt: ast.Import | ast.ImportFrom, alias: ast.alias | None) -> Edit | None:
        if isinstance(stmt, ast.ImportFrom):
            if stmt.level or stmt.module is None:
                return None
            parts = stmt.module.split(".")
            names = [a.name for a in stmt.names]
            if parts[:3] in (["torch", "cuda", "amp"], ["torch", "cpu", "amp"]) and len(parts) <= 4 \
                    and all(n in OLD_PARAMETERS for n in names):
                new_module = "torch.amp"
            elif stmt.module in ("torch.cuda", "torch.cpu") and names == ["amp"]:
                new_module = "torch"
            else:
                return None
            span = name_span(ctx, stmt)
        elif len(stmt.names) == 1 and alias.asname is not None and alias.name in ("torch.cuda.amp", "torch.cpu.amp"):
            new_module, span = "torch.amp", name_span(ctx, alias)
        else:
            return None
        return None if span is None else Edit(*span, new_module)
