from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.enabling import config_choice
from ..engine.outline import walk
from ..engine.region_tables import region_dtype
from ..engine.regions import AutocastCall, autocast_calls, dtype_of, literal_str
from ..engine.rule import Invalid, Rule, Valid
from ..engine.semantics import GRAD_SCALER, scaled_backward_scaler


def _dtype_source(ac: AutocastCall) -> tuple[ast.expr, bool] | None:
    """The expression that passes a region's dtype, and whether it is ``**kwargs``."""
    for keyword in ac.node.keywords:
        if keyword.arg in ("dtype", None):
            return keyword.value, keyword.arg is None
    return None


def _choices(ctx: AstContext, value: ast.expr, kwargs: bool) -> set[str | None] | None:
    """The dtypes a value assigned to a dtype source can pass (None: none, the device's
    default); None when the value is not that plain."""
    if isinstance(value, ast.IfExp):
        body, orelse = _choices(ctx, value.body, kwargs), _choices(ctx, value.orelse, kwargs)
        return None if body is None or orelse is None else body | orelse
    if not kwargs:
        if isinstance(value, ast.Constant) and value.value is None:
            return {None}
        dtype = dtype_of(ctx, value)
        return {dtype} if dtype else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" \
            and not value.args and all(k.arg is not None for k in value.keywords):
        entries = [(k.arg, k.value) for k in value.keywords]
    elif isinstance(value, ast.Dict) and all(k is not None and literal_str(k) for k in value.keys):
        entries = [(literal_str(k), v) for k, v in zip(value.keys, value.values)]
    else:
        return None
    dtype_value = next((v for key, v in entries if key == "dtype"), None)
    if dtype_value is None:
        return {None}
    dtype = dtype_of(ctx, dtype_value)
    return {dtype} if dtype else None


def _runtime_bfloat16(ctx: AstContext, ac: AutocastCall) -> tuple[str, str, tuple] | None:
    """For a region whose dtype comes from a name the file sets either to torch.bfloat16 or to
    nothing (the device's default), at run time: that name, and where it is set to bfloat16."""
    source = _dtype_source(ac)
    if source is None or not isinstance(source[0], (ast.Name, ast.Attribute)):
        return None
    # Once per source: a file's regions often share one (``self.amp_dtype``).
    cache = ctx.__dict__.setdefault("_amp010_sources", {})
    key = (ctx.code(source[0]), source[1])
    if key not in cache:
        cache[key] = _set_to_bfloat16(ctx, *key)
    return cache[key]


def _set_to_bfloat16(ctx: AstContext, code: str, kwargs: bool) -> tuple[str, str, tuple] | None:
    """``_runtime_bfloat16`` for the source spelled ``code`` (``kwargs``: passed as ``**code``)."""
    chosen, bfloat16_at = set(), None
    for node in sorted(ctx.outline.nodes(ast.Assign), key=ctx.order):
        if not any(ctx.code(t) == code for t in node.targets):
            if any(isinstance(t, ast.Subscript) and ctx.code(t.value) == code for t in node.targets):
                return None  # an entry set elsewhere: its dtype is not in sight
            continue
        choices = _choices(ctx, node.value, kwargs)
        if choices is None:
            return None
        chosen |= choices
        if "bfloat16" in choices and bfloat16_at is None:
            bfloat16_at = node
    if any(isinstance(c.func, ast.Attribute) and ctx.code(c.func.value) == code for c in ctx.outline.nodes(ast.Call)):
        return None  # changed in place (``kwargs.update(...)``)
    if bfloat16_at is None or not chosen <= {"bfloat16", None}:
        return None
    return code, f"where line {bfloat16_at.lineno} sets `{code}` to it", ()


def _configured_bfloat16(ctx: AstContext, ac: AutocastCall) -> tuple[str, str, tuple] | None:
    """For a region whose dtype a project function gives for a config value, where a config
    key of the project sets the value that gives bfloat16 (``enabling.config_choice``): the
    value's expression, the switch, and its places."""
    chosen = config_choice(ctx, ac, "bfloat16")
    if chosen is None:
        return None
    switch, value = chosen
    return ctx.code(value), switch.when, switch.related


def _gated(ctx: AstContext, creation: ast.Call, code: str) -> bool:
    """The scaler's creation depends on the dtype: its arguments, or the test of an ``if``
    around it, mention the dtype source (by its last name: ``cfg.amp_dtype`` where the region
    reads ``self.cfg.amp_dtype``) or a torch dtype."""
    last = code.rsplit(".", 1)[-1]

    def mentions(node: ast.AST) -> bool:
        return any(isinstance(n, (ast.Name, ast.Attribute))
                   and ((n.attr if isinstance(n, ast.Attribute) else n.id) == last or dtype_of(ctx, n))
                   for n in walk(node))

    if any(mentions(a) for a in (*creation.args, *creation.keywords)):
        return True
    child, ancestor = creation, ctx.parent(creation)
    while ancestor is not None:
        if isinstance(ancestor, (ast.If, ast.IfExp)) and child is not ancestor.test and mentions(ancestor.test):
            return True
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child, ancestor = ancestor, ctx.parent(ancestor)
    return False


class ScalerWithBfloat16(Rule):
    """
    ## What it does
    Finds `S.scale(loss).backward()` in a function whose autocast regions all run in bfloat16
    (explicitly, or by the device's default per the policy tables, e.g. cpu).

    Also finds a GradScaler built whatever the dtype when a region of a function that scales
    its loss takes its dtype from a name (`dtype=amp_dtype`, `**autocast_args`) that the file
    sets only to `torch.bfloat16` or to nothing (the device's default), at run time (`if
    torch.cuda.is_bf16_supported(): autocast_args = dict(dtype=torch.bfloat16)`): where
    bfloat16 is chosen the scaler still runs. Likewise where the dtype is what a project
    function gives for a config value (`dtype=get_amp_type(cfg.amp.amp_dtype)`, the function
    returning `torch.bfloat16` when its parameter is `"bfloat16"`) and a config file of the
    project sets that key to that value (`amp: {amp_dtype: bfloat16}`): the finding names the
    key and the function's `return`. Reported at the `GradScaler(...)` call when neither its
    arguments nor the test of an `if` around it mention that name (by its last part) or a
    dtype.

    ## Why is this bad?
    bfloat16 has float32's exponent range, so gradients do not underflow and loss scaling buys
    nothing; it only adds an unscale pass and inf checks per step, and skips steps for no
    reason after a genuine overflow. Informational.

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## Fix
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    No automatic fix (the scaler's step, update and checkpoint go too).

    ## False positives
    A GradScaler is recognised as: a name or attribute assigned `torch.amp.GradScaler(...)` /
    `torch.cuda.amp.GradScaler(...)` anywhere in the file, the receiver `S` of
    `S.scale(loss).backward()`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`.
    A function whose regions use float16 or an expression for the dtype is not reported, nor
    is a run-time choice the file can also make float16, or whose value is not in sight (a
    parameter, an entry set elsewhere, `kwargs.update(...)`): such code may gate its scaler
    in ways not seen here. A scaler gated through another name (`enabled=use_scaler`, where
    `use_scaler` looks at the dtype) is reported; the rule does not follow that name.
    """

    code = "AMP010"
    name = "scaler-with-bfloat16"
    summary = "GradScaler used with bfloat16 autocast (not needed)"
    uses_policy = True
    fragments = (r"\.scale\(",)

    valid = (
        Valid("""
import torch
with torch.autocast("cuda", dtype=amp_dtype):
    loss = model(x)
scaler.scale(loss).backward()
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    loss = model(x)
scaler.scale(loss).backward()
"""),
        # The scaler runs only where the run-time choice leaves float16.
        Valid("""
import torch
autocast_args = {}
if torch.cuda.is_bf16_supported():
    autocast_args = dict(dtype=torch.bfloat16)
scaler = torch.amp.GradScaler("cuda", enabled="dtype" not in autocast_args)
def train_step(model, x, optimizer):
    with torch.autocast("cuda", **autocast_args):
        loss = model(x).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""),
        # The file also chooses float16: the choice is made elsewhere too, the scaler may follow it.
        Valid("""
import torch
class Trainer:
    def __init__(self, bf16):
        self.amp_dtype = torch.bfloat16 if bf16 else torch.float16
        self.scaler = self.make_scaler()
    def train_step(self, x):
        with torch.autocast("cuda", dtype=self.amp_dtype):
            loss = self.model(x).mean()
        self.scaler.scale(loss).backward()
"""),
    )
    invalid = (
        Invalid("""
import torch
def step(model, x, scaler, optimizer):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((6, 5, '`scaler` scales a bfloat16 loss'),)),
        Invalid("""
import torch
with torch.autocast("cpu"):
    loss = model(x).mean()
scaler.scale(loss).backward()
""", at=((5, 1, '`scaler` scales a bfloat16 loss'),)),
        # bfloat16 where the GPU supports it, float16 (cuda's default) elsewhere; the scaler always.
        Invalid("""
import torch
from torch.cuda.amp import GradScaler, autocast
autocast_args = dict()
if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
    autocast_args = dict(dtype=torch.bfloat16)
def run(options, model, optimizer, loader):
    scaler = GradScaler() if options.use_amp else None
    train_one_epoch(model, optimizer, loader, scaler)
def train_one_epoch(model, optimizer, loader, scaler):
    for batch in loader:
        with autocast(scaler is not None, **autocast_args):
            loss = model(**batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
""", at=((8, 14, 'the autocast region of line 12 runs in bfloat16 where line 6 sets `autocast_args`'),)),
    )

    def check(self, ctx: AstContext) -> None:
        scaled: dict[int, list[tuple[ast.Call, str]]] = {}  # by id of the function; id(None): the module
        for call in sorted(ctx.outline.method_calls("backward"), key=ctx.order):
            scaler = scaled_backward_scaler(ctx, call)
            if scaler is not None:
                scaled.setdefault(id(ctx.enclosing_function(call)), []).append((call, scaler))
        if not scaled:
            return
        regions: dict[int, list[AutocastCall]] = {}
        for ac in autocast_calls(ctx):
            if ac.enabled is not False:
                regions.setdefault(id(ctx.enclosing_function(ac.node)), []).append(ac)
        for scope, backwards in scaled.items():
            scope_regions = regions.get(scope, [])
            if scope_regions and all(region_dtype(ctx, ac) == "bfloat16" for ac in scope_regions):
                for call, scaler in backwards:
                    ctx.report(call, f"`{scaler}` scales a bfloat16 loss: bfloat16 does not "
                               "underflow like float16, so the GradScaler is not needed")
        runtime = next(((ac, found) for scope in scaled for ac in regions.get(scope, [])
                        if (found := _runtime_bfloat16(ctx, ac) or _configured_bfloat16(ctx, ac))), None)
        if runtime is None:
            return
        ac, (code, because, related) = runtime
        for creation in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            if ctx.resolves_to(creation.func, GRAD_SCALER) and not _gated(ctx, creation, code):
                ctx.report(creation, f"GradScaler built whatever the dtype, but the autocast region of line "
                           f"{ac.node.lineno} runs in bfloat16 {because}: bfloat16 needs no loss scaling; "
                           "build the scaler only for float16 (or pass that choice as `enabled=`)",
                           related=related)
