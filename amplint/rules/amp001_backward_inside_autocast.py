from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.crossfile import located
from ..engine.diagnostics import Fix, Related
from ..engine.enabling import region_switch, setting_switch
from ..engine.outline import walk
from ..engine.region_tables import disables_itself
from ..engine.regions import autocast_region, optim_wrapper_setting, project_autocast_wrapper
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import steps_optimizer
from ..engine.summaries import callee_summary, framework_backward

_AUTOGRAD = frozenset({"torch.autograd.backward", "torch.autograd.grad"})

# Calls that may move out of the region with the backward pass: autocast does not change
# what they compute (the optimizer and scaler work on float32 state; .item() reads a value).
_MOVABLE_METHODS = frozenset({"backward", "step", "update", "unscale_", "zero_grad", "item",
                              "detach", "append", "add_scalar", "log", "info", "debug",
                              "set_postfix", "clip_grad_norm_", "clip_grad_value_"})
_MOVABLE_FUNCTIONS = frozenset({"print"})


def _project_wrapper(ctx: AstContext, region: ast.AST):
    """The project's own autocast wrapper a ``with`` opens, if that is what makes it a region."""
    if not isinstance(region, (ast.With, ast.AsyncWith)):
        return None
    return next((w for item in reversed(region.items)
                 if (w := project_autocast_wrapper(ctx, item.context_expr)) is not None), None)


def _optim_wrapper(ctx: AstContext, region: ast.AST):
    """The project's ``AmpOptimWrapper`` setting, where an optimizer wrapper's ``optim_context``
    is what makes the ``with`` a region."""
    if not isinstance(region, (ast.With, ast.AsyncWith)):
        return None
    return next((s for item in reversed(region.items) if (s := optim_wrapper_setting(ctx, item.context_expr))), None)


def _opened_by(ctx: AstContext, setting) -> tuple[str, tuple]:
    """How a finding in an optimizer wrapper's region says what turns it on, and where."""
    switch = setting_switch(ctx, setting)
    return f"an optimizer wrapper's `optim_context` runs autocast {switch.when}", switch.related


def _movable_expr(expr: ast.expr) -> bool:
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return True
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float, str, bytes))
    if isinstance(expr, ast.Call):
        func = expr.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in _MOVABLE_METHODS if isinstance(func, ast.Attribute) else name in _MOVABLE_FUNCTIONS:
            arguments = [a.value if isinstance(a, ast.Starred) else a for a in expr.args]
            return all(_movable_expr(a) or _plain(a) for a in (*arguments, *(k.value for k in expr.keywords)))
        return False
    if isinstance(expr, ast.BinOp):
        return _movable_expr(expr.left) and _movable_expr(expr.right)
    return False


def _plain(expr: ast.expr) -> bool:
    """Arguments without calls in them cannot run ops."""
    return not any(isinstance(n, ast.Call) for n in walk(expr))


def _movable_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Expr):
        return _movable_expr(stmt.value)
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return stmt.value is not None and _movable_expr(stmt.value)
    return isinstance(stmt, (ast.Pass, ast.Delete))


def _statement_of(ctx: AstContext, node: ast.AST) -> ast.AST:
    """The innermost statement that holds ``node``."""
    while not isinstance(node, ast.stmt) and ctx.parent(node) is not None:
        node = ctx.parent(node)
    return node


class BackwardInsideAutocast(Rule):
    """
    ## What it does
    Finds backward passes — `loss.backward()`, `scaler.scale(loss).backward()`,
    `torch.autograd.backward(...)`, `torch.autograd.grad(...)` — inside an enabled autocast
    region: a `with torch.autocast(...)` block (any spelling or alias, or a name bound to one),
    a function decorated with autocast, or a `with` on a framework's or project's own autocast
    context (`with accelerator.autocast():`, `with self.autocast():`, a method named `autocast`
    on an object), or a call of the project's own autocast wrapper, in any of its files (a
    `@contextmanager` that yields inside `torch.autocast`, a function returning one, a
    `functools.partial` or alias of one, a wrapper of those; see `project_index`): the message
    then names the wrapper's definition, also a related location in JSON and SARIF. A nested
    `autocast(enabled=False)` block ends the region, and so does one
    whose dtype its device does not accept (`torch.autocast("cpu", dtype=torch.float64)`,
    which torch turns off; AMP011 reports it). A backward pass is also a framework's
    `accelerator.backward(loss)`, Lightning's `self.manual_backward(loss)` and an optimizer
    wrapper's `update_params(loss)` (mmengine's, which backpropagates and steps).

    An optimizer wrapper's `with optim_wrapper.optim_context(model):` is a region where the
    project makes the wrapper an `AmpOptimWrapper`: a training script's
    `cfg.optim_wrapper.type = 'AmpOptimWrapper'` (behind `--amp`), a config's
    `optim_wrapper = dict(type='AmpOptimWrapper', ...)`. The message names that setting and,
    for a script's, the switch it sits behind ("when `--amp` is set (tools/train.py:20)"), also
    as related locations; no fix is offered there (the context does more than autocast).

    A region may be chosen at run time: `ctx = torch.autocast if use_amp else
    contextlib.nullcontext` then `with ctx("cuda"):`, or `amp = torch.autocast("cuda") if
    use_amp else nullcontext()` then `with amp:`; the message says when it applies ("when
    `--amp` is set (train.py:12)").

    The backward pass may run in a function called inside a region the file opens itself (not
    one only a project wrapper opens): one of the file
    (`helper(...)`, `self.helper(...)`) or of another module of the project (`from .engine
    import train_step`, `engine.train_step(...)`), followed up to three calls deep
    (`summaries`). The finding then sits on the call in the region and names the backward's
    line and the helpers on the way, also as a related location. It is made where an optimizer
    steps on those gradients, in a function on the way or anywhere in the file
    (`optimizer.step()`, `scaler.step(optimizer)`): a helper that runs a backward only to
    measure it (a batch-size probe on a copy of the model) trains nothing.

    ## Why is this bad?
    PyTorch's AMP documentation: "Backward passes under autocast are not recommended."
    Backward ops run in the dtype autocast chose for the matching forward ops anyway; running
    them inside the region only adds casts, and can make them run at a precision the forward
    did not use.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
    ```

    ## Fix
    ```python
    with torch.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    ```

    ## Fix safety
    Safe. It is offered only when the backward statement and every statement after it are the
    tail of the `with` body, the `with` has no other context manager, and that tail only holds
    calls autocast does not affect (backward, optimizer and scaler steps, `zero_grad`,
    `.item()`, logging, clipping). Names bound inside the block stay bound after it, so moving
    the tail out changes nothing else. Otherwise the finding has no fix.

    ## False positives
    None known: a backward call inside an enabled region is always this mistake. Through a
    helper, the helper's backward runs on every call the code shows; one that runs it only
    on some branch (`if train: loss.backward()`) is still reported, since that branch runs
    inside the region. A region
    whose `enabled=` is an expression counts as enabled, and so does a framework's autocast
    (it may be off when the framework runs without mixed precision; the backward still
    belongs after the block).
    """

    code = "AMP001"
    name = "backward-inside-autocast"
    summary = "Backward pass inside an autocast region"
    fixable = True
    uses_policy = True  # which dtypes a region's device accepts
    # A backward pass in a region (which a call of the project's wrapper also opens); or a
    # region the file opens itself, where a helper's backward counts: another spelling of
    # the word, so that files without it do not ask the project's wrappers for it. An optimizer
    # wrapper's context opens one where the project sets an AmpOptimWrapper.
    fragments = (("autocast", AnyOf("backward", "autograd")), r"autocast\W", r"optim_context\(")
    project_wrappers_for = "autocast"  # `with amp_ctx():`, a wrapper of the project's

    valid = (
        Valid("""
import contextlib
import torch
from engine import apply_gradients
def fit(model, loader, optimizer, use_amp):
    ctx = torch.autocast if use_amp else contextlib.nullcontext
    for x, y in loader:
        with ctx("cuda"):
            loss = model(x, y)
        apply_gradients(loss, optimizer)
""", project=(("engine.py", """
def apply_gradients(loss, optimizer):
    loss.backward()
    optimizer.step()
"""),)),
        Valid("""
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        output = model(x)
        loss = loss_fn(output, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    loss = model(x).sum()
    with torch.autocast("cuda", enabled=False):
        loss.float().backward()
"""),
        Valid("""
import torch
with torch.autocast("cuda"):
    def closure():
        loss = model(x)
        loss.backward()
        return loss
optimizer.step(closure)
"""),
        Valid("""
import torch
with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
    loss = model(x)
loss.backward()
"""),
        # A framework's autocast around the forward only.
        Valid("""
def train_step(self, x, y):
    with self.accelerator.autocast():
        loss = self.loss_fn(self.model(x), y)
    self.accelerator.backward(loss)
"""),
        # torch turns off a region whose dtype its device does not accept.
        Valid("""
import torch
with torch.autocast("cpu", dtype=torch.float64):
    loss = model(x).mean()
    loss.backward()
"""),
        Valid("""
def train_step(self, x, y):
    with self.accelerator.autocast(enabled=False):
        loss = self.model(x, y)
        self.accelerator.backward(loss)
"""),
        # A memory probe: the helper's backward trains nothing, no optimizer steps anywhere.
        Valid("""
import copy
import torch
from profiling import time_forward_backward
def largest_batch(model, sizes):
    with torch.autocast("cuda"):
        return [time_forward_backward(copy.deepcopy(model), torch.randn(n, 3, 64, 64)) for n in sizes]
""", project=(("profiling.py", """
def time_forward_backward(model, x):
    y = model(x)
    y.float().sum().backward()
    return torch.cuda.max_memory_allocated()
"""),)),
        # apex's loss-scaling context wants the backward inside it; it is no autocast.
        Valid("""
from apex import amp
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
"""),
    )
    invalid = (
        Invalid("""
import torch
from engine import apply_gradients
def fit(model, loader, optimizer):
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
            apply_gradients(loss, optimizer)
""", at=((8, 13, "`apply_gradients(...)` runs `loss.backward()` (engine.py:3) inside an autocast region"),),
            project=(("engine.py", """
def apply_gradients(loss, optimizer):
    loss.backward()
    optimizer.step()
"""),)),
        Invalid("""
import torch
with torch.autocast("cuda"):
    loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", fixed="""
import torch
with torch.autocast("cuda"):
    loss = loss_fn(model(x), y)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
""", at=((5, 5, '`backward()` inside an autocast region'),)),
        Invalid("""
from torch.cuda.amp import autocast as ac
def train_step(model, x):
    with ac():
        loss = model(x).mean()
        loss.backward()
""", fixed="""
from torch.cuda.amp import autocast as ac
def train_step(model, x):
    with ac():
        loss = model(x).mean()
    loss.backward()
""", at=((6, 9, '`backward()` inside an autocast region'),)),
        # Something after the backward depends on the region: report, no fix.
        Invalid("""
import torch
with torch.autocast("cuda"):
    loss = model(x).mean()
    loss.backward()
    next_out = model(x2)
""", at=((5, 5, '`backward()` inside an autocast region'),)),
        Invalid("""
import torch
ctx = torch.autocast("cuda", dtype=torch.bfloat16)
with ctx:
    loss = model(x).mean()
    grads = torch.autograd.grad(loss, model.parameters())
""", at=((6, 13, '`backward()` inside an autocast region'),)),
        Invalid("""
import torch
@torch.autocast("cuda")
def step(model, x):
    loss = model(x).mean()
    loss.backward()
""", at=((6, 5, '`backward()` inside an autocast region'),)),
        # A dtype the region's device accepts: the region runs, and the backward in it.
        Invalid("""
import torch
with torch.autocast("cpu", dtype=torch.float16):
    loss = model(x).mean()
    loss.backward()
""", fixed="""
import torch
with torch.autocast("cpu", dtype=torch.float16):
    loss = model(x).mean()
loss.backward()
""", at=((5, 5, '`backward()` inside an autocast region'),)),
        # Found by fuzzing: two backward passes in one block get one fix that moves both.
        Invalid("""
import torch
with torch.autocast("cuda"):
    out = model(x)
    scaler.scale(loss_a).backward()
    scaler.scale(loss_b).backward()
""", fixed="""
import torch
with torch.autocast("cuda"):
    out = model(x)
scaler.scale(loss_a).backward()
scaler.scale(loss_b).backward()
""", at=((5, 5, '`backward()` inside an autocast region'), (6, 5, '`backward()` inside an autocast region'),)),
        Invalid("""
import torch
with torch.autocast("cuda", enabled=use_amp):
    loss = model(x).mean()
    if use_amp:
        scaler.scale(loss).backward()
    else:
        loss.backward()
""", at=((6, 9, '`backward()` inside an autocast region'), (8, 9, '`backward()` inside an autocast region'),)),
        # A framework's autocast context and its backward.
        Invalid("""
def train_step(self, x, y):
    with self.accelerator.autocast():
        loss = self.loss_fn(self.model(x), y)
        self.accelerator.backward(loss)
    return loss
""", fixed="""
def train_step(self, x, y):
    with self.accelerator.autocast():
        loss = self.loss_fn(self.model(x), y)
    self.accelerator.backward(loss)
    return loss
""", at=((5, 9, '`backward()` inside an autocast region'),)),
        Invalid("""
import torch
def step(self, batch):
    with self.accelerator.accumulate(self.model), self.autocast(), torch.enable_grad():
        loss = self.model(batch).mean()
        self.accelerator.backward(loss)
""", at=((6, 9, '`backward()` inside an autocast region'),)),
    )

    def check(self, ctx: AstContext) -> None:
        fixed_blocks: set[int] = set()
        for call in sorted(ctx.outline.nodes(ast.Call), key=ctx.order):
            is_method = isinstance(call.func, ast.Attribute)
            is_backward = (is_method and call.func.attr == "backward") \
                or ctx.resolves_to(call.func, _AUTOGRAD) is not None or framework_backward(call)
            region = autocast_region(ctx, call, frameworks=True)
            if region is None or (region[0] is not None and disables_itself(ctx, region[0])):
                continue
            if not is_backward:
                self._through_helper(ctx, call, region)
                continue
            what = f"{call.func.attr}(...)" if framework_backward(call) else "backward()" if is_method \
                else ctx.code(call.func) + "()"
            setting = _optim_wrapper(ctx, region[1]) if region[0] is None else None
            # One fix per block: the first backward's fix moves every later one out with it. An
            # optimizer wrapper's context does more than autocast: no fix moves code out of it.
            fix = None if id(region[1]) in fixed_blocks or setting else self._fix(ctx, call, region[1])
            if fix is not None:
                fixed_blocks.add(id(region[1]))
            if setting is not None:
                opened, related = _opened_by(ctx, setting)
                ctx.report(call, f"`{what}` inside an autocast region ({opened}): run the backward pass after "
                                 "the `with` block", related=related)
                continue
            wrapper = _project_wrapper(ctx, region[1]) if region[0] is None else None
            if wrapper is None:
                switch = region_switch(ctx, region[0], device=False) if region[0] is not None else None
                ctx.report(call, f"`{what}` inside an autocast region{f' ({switch.when})' if switch else ''}: "
                                 "run the backward pass after the `with` block", fix,
                           related=switch.related if switch else ())
                continue
            root = ctx.project()[0]
            ctx.report(call, f"`{what}` inside an autocast region (`{wrapper.name}` opens autocast, "
                             f"{wrapper.where(root)}): run the backward pass after the `with` block", fix,
                       related=(Related(wrapper.shown_path(), wrapper.row, f"`{wrapper.name}` opens autocast"),))

    @staticmethod
    def _through_helper(ctx: AstContext, call: ast.Call, region) -> None:
        """A call in the region of a project function that runs a backward pass (``summaries``)."""
        summary = callee_summary(ctx, call)
        if summary is None or not summary.backwards:
            return
        if not summary.steps and not any(steps_optimizer(c) for c in ctx.outline.nodes(ast.Call)):
            return  # no optimizer steps on these gradients: a measurement (a memory probe), not training
        backward = summary.backwards[0][0]
        where, related = located(ctx, backward.path, backward.row, f"`{backward.code}`, in `{(summary.name, *backward.via)[-1]}`")
        through = f" through `{'` and `'.join(backward.via)}`" if backward.via else ""
        switch = region_switch(ctx, region[0], device=False) if region[0] is not None else None
        setting = _optim_wrapper(ctx, region[1]) if region[0] is None else None
        opened, opened_related = _opened_by(ctx, setting) if setting else (None, ())
        when = f" ({switch.when})" if switch else f" ({opened})" if opened else ""
        ctx.report(call, f"`{ctx.code(call.func)}(...)` runs `{backward.code}` ({where}{through}) inside an "
                         f"autocast region{when}: call it after the `with` block, or move the backward pass out of it",
                   related=(related, *(switch.related if switch else ()), *opened_related))

    @staticmethod
    def _fix(ctx: AstContext, call: ast.Call, region: ast.AST) -> Fix | None:
        if not isinstance(region, (ast.With, ast.AsyncWith)) or len(region.items) != 1:
            return None
        stmt = _statement_of(ctx, call)
        body = region.body
        index = next((i for i, s in enumerate(body) if s is stmt), None)
        # the statements sharing its line go with it
        while index and body[index - 1].end_lineno >= body[index].lineno:
            index -= 1
        if not index or not all(_movable_statement(s) for s in body[index:]):
            return None
        edit = ctx.out_of_block(region, body[index])
        return Fix("Move the backward pass out of the autocast region", (edit,), "safe") if edit else None
