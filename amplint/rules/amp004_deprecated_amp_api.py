from __future__ import annotations

import libcst as cst

from ..engine.context import FileContext
from ..engine.diagnostics import Edit, Fix
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import bind, has_star_args

# qualified name -> (name in torch.amp, device)
_DEPRECATED = {}
for _device in ("cuda", "cpu"):
    for _name, _modules in (("autocast", ("", "autocast_mode.")), ("GradScaler", ("", "grad_scaler.")),
                            ("custom_fwd", ("", "autocast_mode.")), ("custom_bwd", ("", "autocast_mode."))):
        for _module in _modules:
            _DEPRECATED[f"torch.{_device}.amp.{_module}{_name}"] = (_name, _device)
_NEW_API = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}

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


def _subtree(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _is_attr_name(ctx: FileContext, node: cst.CSTNode) -> bool:
    """`autocast` in `x.autocast` does not refer to a name `autocast`."""
    parent = ctx.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr is node


class DeprecatedAmpApi(Rule):
    """
    ## What it does
    Finds the deprecated per-device AMP API — `torch.cuda.amp.autocast`,
    `torch.cpu.amp.autocast`, `torch.cuda.amp.GradScaler`, `torch.cpu.amp.GradScaler`,
    `torch.cuda.amp.custom_fwd` / `custom_bwd` — in any spelling: `import torch as th`,
    `from torch.cuda.amp import autocast as ac`, `from torch.cuda import amp`.

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
    that is not called (`ctx = autocast`, an annotation), or when a name from the deprecated
    import is used in any other way.

    ## False positives
    None: these names are deprecated wherever they appear.
    """

    code = "AMP004"
    name = "deprecated-amp-api"
    summary = "Deprecated torch.cuda.amp / torch.cpu.amp API"
    fixable = True
    fragments = (r"(?:cuda|cpu)\.amp\b", r"from\s+torch\.(?:cuda|cpu)\s+import[^\n]*\bamp\b")
    # A use, not a mention in a comment or a docstring.
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
""", at=((3, 10, '`GradScaler` is deprecated (torch.cuda.amp.GradScaler)'), (4, 6, '`ac` is deprecated (torch.cuda.amp.autocast)'),)),
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
""", at=((3, 15, '`autocast` is deprecated (torch.cuda.amp.autocast)'), (4, 6, '`autocast` is deprecated (torch.cuda.amp.autocast)'),)),
        Invalid("""
import torch
def make(args, kwargs):
    return torch.cuda.amp.GradScaler(*args, **kwargs)
""", at=((4, 12, '`torch.cuda.amp.GradScaler` is deprecated (torch.cuda.amp.Gr'),)),
    )

    def check(self, ctx: FileContext) -> None:
        imports = ctx.nodes(cst.Import) + ctx.nodes(cst.ImportFrom)
        in_imports = {id(n) for imp in imports for n in _subtree(imp)}
        # References outside import statements.
        references = [n for n in ctx.nodes(cst.Attribute) + ctx.nodes(cst.Name)
                      if id(n) not in in_imports and not _is_attr_name(ctx, n)]
        uses = []
        for ref in references:
            parent = ctx.parent(ref)
            if isinstance(parent, cst.Attribute) and parent.value is ref:
                continue  # a prefix of a longer reference
            target = ctx.resolves_to(ref, _DEPRECATED.keys())
            if target is not None:
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
        # So is one whose names are also used for something else.
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
            shown = f"torch.amp.{new_name}(" + ('device_type=' if new_name.startswith('custom') else '') + f'"{device}", ...)'
            message = f"`{_dotted(ref) or ctx.code(ref)}` is deprecated ({target}): use `{shown}`"
            fix = None
            if plan is not None:
                node, replacement, import_edit = plan
                if import_edit is None or id(import_edit[0]) not in broken:
                    edits = [ctx.replace(node, replacement)]
                    group = None
                    if import_edit is not None:
                        edits.append(import_edit[1])
                        group = f"{self.code}-import-{import_edit[1].start}"
                    fix = Fix(f"Use `{shown}`", tuple(edits), "safe", group)
            ctx.report(ref, message, fix)

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
        if root is None:
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

        parent = ctx.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            call = self._call(parent, new_ref, new_name, device)
            return None if call is None else (parent, ctx.module.code_for_node(call), import_edit)
        if isinstance(parent, cst.Decorator) and new_name in ("custom_fwd", "custom_bwd"):
            return ref, f'{new_ref}(device_type="{device}")', import_edit
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
    def _import_edit(ctx: FileContext, stmt, alias: cst.ImportAlias) -> Edit | None:
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
