from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..engine import flow
from ..engine.ast_context import AstContext
from ..engine.diagnostics import Related
from ..engine.flow import line_of
from ..engine.loss_scale import Scaled, arguments, bound_names, last_name, reads_scale, scale_names, scaled, unstarred
from ..engine.outline import named_parameters
from ..engine.regions import bind, called_function, calls_of, value_before
from ..engine.rule import Invalid, Rule, Valid
from ..engine.summaries import checked_module, receiver

_GRAD = frozenset({"torch.autograd.grad"})
_GRAD_PARAMETERS = ("outputs", "inputs", "grad_outputs", "retain_graph", "create_graph")
_AUTOGRAD_BACKWARD = frozenset({"torch.autograd.backward"})
# Functions whose result is their tensor argument multiplied or divided by the other one.
_SCALING_FUNCTIONS = frozenset({"torch.mul", "torch.multiply", "torch.div", "torch.divide", "torch.true_divide",
                                "torch._foreach_mul", "torch._foreach_div"})
# ... and those that do it in place, to the gradients themselves.
_SCALING_IN_PLACE_FUNCTIONS = frozenset({"torch._foreach_mul_", "torch._foreach_div_"})
_SCALING_METHODS = frozenset({"mul", "div", "multiply", "divide", "true_divide", "__mul__", "__truediv__"})
_SCALING_IN_PLACE_METHODS = frozenset({"mul_", "div_", "multiply_", "divide_", "true_divide_"})
# Methods and builtins whose result leaves the graph: a number for a log, not a loss term.
_LEAVES_GRAPH_METHODS = frozenset({"item", "tolist", "numpy", "detach", "detach_", "backward"})
_LEAVES_GRAPH_FUNCTIONS = frozenset({"len", "print", "float", "int", "bool", "str", "repr", "format",
                                     "isinstance", "type", "id", "hasattr"})
# What the loss scale does not change: a sign, a direction, a test. An adversarial step
# (`x + eps * g.sign()`) or a normalized gradient is no penalty off by the scale.
_SCALE_FREE_METHODS = frozenset({"sign", "sgn", "argmax", "argmin", "argsort", "isfinite", "isnan", "isinf"})
_SCALE_FREE_FUNCTIONS = frozenset({"torch.sign", "torch.sgn", "torch.nn.functional.normalize", "torch.argmax",
                                   "torch.argmin", "torch.argsort", "torch.isfinite", "torch.isnan", "torch.isinf"})
_STATEMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return, ast.For, ast.AsyncFor)
_WORDS = re.compile(r"_+|(?<=[a-z0-9])(?=[A-Z])")
_LOSS_WORDS = frozenset({"loss", "losses", "cost", "objective"})


def _loss_like(target: ast.expr) -> bool:
    """``loss``, ``d_loss``, ``loss_D``, ``lossG``, ``D_cost``, ``self.total_loss``, ``errD``:
    named like a loss (not ``grad_loss_ratio``)."""
    words = [w.lower() for w in _WORDS.split(last_name(target) or "") if w]
    return bool(words) and (words[-1] in _LOSS_WORDS or (len(words) == 2 and words[0] in _LOSS_WORDS | {"err"}))


def _statements(ctx: AstContext, scope: ast.AST) -> list[ast.stmt]:
    """The assignments, expression statements, returns and `for`s of a function (or of the
    module's own code), in source order; not those of functions or classes inside it."""
    cache = ctx.__dict__.setdefault("_amp021_statements", {})
    if id(scope) not in cache:
        cache[id(scope)] = sorted((n for n in checked_module(ctx).scope_nodes(scope) if isinstance(n, _STATEMENTS)),
                                  key=ctx.order)
    return cache[id(scope)]


def _scope(ctx: AstContext, node: ast.AST) -> ast.AST:
    return ctx.enclosing_function(node) or ctx.outline.tree


@dataclass
class _Use:
    """Where gradients of a scaled value went in one function."""

    sink: ast.AST | None = None  # the statement or call that puts them into a loss
    what: str = ""  # how, for the message
    returned: bool = False  # whether the function returns them (or what was built from them)


class _Gradients:
    """Follows the value of one call (``seed``: a `torch.autograd.grad` call, or a call of a
    helper that returns one) through a function, statement by statement in source order:
    which names hold it or a value computed from it, until it is multiplied or divided by the
    loss scale (``loss_scale.scale_names``), turned into a number (`.item()`, `float()`), or
    put into a loss."""

    def __init__(self, ctx: AstContext, scope: ast.AST, seed: ast.Call):
        self.ctx, self.scope, self.seed = ctx, scope, seed
        self.scales = scale_names(ctx, scope)

    def unscales(self, expr: ast.expr, held: set[str]) -> bool:
        """``expr`` reads the loss scale and is no gradient itself."""
        return reads_scale(self.ctx, [expr], self.scales) and not self.holds(expr, held)

    def holds(self, expr: ast.expr, held: set[str]) -> bool:
        """Whether ``expr``'s value is (or is computed from) the scaled gradients, where the
        names ``held`` hold them."""
        if expr is self.seed:
            return True
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return self.ctx.code(expr) in held or isinstance(expr, ast.Attribute) and self.holds(expr.value, held)
        if isinstance(expr, (ast.Subscript, ast.Starred, ast.NamedExpr, ast.Await)):
            return self.holds(expr.value, held)
        if isinstance(expr, ast.Call):
            return self._call_holds(expr, held)
        if isinstance(expr, ast.BinOp):
            left, right = self.holds(expr.left, held), self.holds(expr.right, held)
            if left and right and isinstance(expr.op, ast.Div):
                return False  # `g / g.norm()`: the scale cancels
            if isinstance(expr.op, (ast.Mult, ast.Div)) and \
                    ((left and self.unscales(expr.right, held)) or (right and self.unscales(expr.left, held))):
                return False
            return left or right
        if isinstance(expr, ast.UnaryOp):
            return self.holds(expr.operand, held)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return any(self.holds(e, held) for e in expr.elts)
        if isinstance(expr, ast.Dict):
            return any(k is not None and self.holds(v, held) for k, v in zip(expr.keys, expr.values))
        if isinstance(expr, ast.IfExp):
            return self.holds(expr.body, held) or self.holds(expr.orelse, held)
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(held)
            for clause in expr.generators:
                names = bound_names(self.ctx, clause.target)
                if self.holds(clause.iter, inner):
                    inner.update(names)
                else:
                    inner.difference_update(names)
            return self.holds(expr.value if isinstance(expr, ast.DictComp) else expr.elt, inner)
        return False

    def _call_holds(self, call: ast.Call, held: set[str]) -> bool:
        ctx, found, given = self.ctx, receiver(call), arguments(call)
        if found is not None:
            if found[1] in _LEAVES_GRAPH_METHODS or found[1] in _SCALE_FREE_METHODS:
                return False
            if found[1] in _SCALING_METHODS and self.holds(found[0], held) \
                    and any(self.unscales(a, held) for a in given):
                return False
        names = ctx.outline.qualified_names(call.func)
        if isinstance(call.func, ast.Name) and not names and call.func.id in _LEAVES_GRAPH_FUNCTIONS:
            return False
        if any(n.startswith("math.") for n in names) or ctx.resolves_to(call.func, _SCALE_FREE_FUNCTIONS):
            return False
        if any(self.holds(a, held) for a in given):
            if ctx.resolves_to(call.func, _SCALING_FUNCTIONS) and any(self.unscales(a, held) for a in given):
                return False
            # A helper given the scaler or the scale may unscale them itself.
            if any(flow.key(ctx, a) in flow.scalers(ctx) or self.unscales(a, held) for a in given):
                return False
            helper = called_function(ctx, call)
            return helper is None or not reads_scale(ctx, helper.body, set())
        return found is not None and self.holds(found[0], held)

    def _unscaled_in_place(self, call: ast.Call, held: set[str]) -> bool:
        """``g.mul_(inv_scale)``, ``torch._foreach_div_(grads, scale)``."""
        found, given = receiver(call), arguments(call)
        if found is not None and found[1] in _SCALING_IN_PLACE_METHODS and self.holds(found[0], held) \
                and any(self.unscales(a, held) for a in given):
            return True
        return bool(self.ctx.resolves_to(call.func, _SCALING_IN_PLACE_FUNCTIONS)) and \
            any(self.holds(a, held) for a in given) and any(self.unscales(a, held) for a in given)

    def _into_backward(self, call: ast.Call, held: set[str]) -> bool:
        """``x.backward()``, ``S.scale(x)``, ``torch.autograd.backward(x)`` of a held ``x``."""
        found, given = receiver(call), arguments(call)
        if found is not None and (found[1] == "backward" and self.holds(found[0], held)
                                  or found[1] == "scale" and any(self.holds(a, held) for a in given)):
            return True
        return bool(self.ctx.resolves_to(call.func, _AUTOGRAD_BACKWARD)) and bool(given) and self.holds(given[0], held)

    def follow(self) -> _Use | None:
        """Where the value goes; None when it is unscaled in place first."""
        ctx, seed, use = self.ctx, self.seed, _Use()
        held: set[str] = set()
        for statement in _statements(ctx, self.scope):
            if (statement.end_lineno, statement.end_col_offset) <= (seed.lineno, seed.col_offset):
                continue  # before the seed
            if isinstance(statement, (ast.For, ast.AsyncFor)):
                names = bound_names(ctx, statement.target)
                if ctx.order(statement.body[0]) > ctx.order(seed) and self.holds(statement.iter, held):
                    held.update(names)
                else:
                    held.difference_update(names)
                continue
            for call in flow.calls_in(ctx, statement):
                if self._unscaled_in_place(call, held):
                    return None
                if self._into_backward(call, held):
                    use.sink, use.what = call, "backpropagates a penalty built from them"
                    return use
            if isinstance(statement, ast.Return):
                use.returned = use.returned or (statement.value is not None and self.holds(statement.value, held))
                continue
            if isinstance(statement, ast.Expr) or statement.value is None:
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names = [n for t in targets for n in bound_names(ctx, t)]
            holds = self.holds(statement.value, held)
            if isinstance(statement, ast.AugAssign):
                target = ctx.code(statement.target)
                if target in held and isinstance(statement.op, (ast.Mult, ast.Div)) \
                        and self.unscales(statement.value, held):
                    held.discard(target)
                    continue
                holds = holds or target in held
            if not holds:
                held.difference_update(names)
                continue
            loss = next((t for t in targets if _loss_like(t)), None)
            if loss is not None:
                use.sink, use.what = statement, f"adds a penalty built from them to `{ctx.code(loss)}`"
                return use
            held.update(names)
        return use


class GradientPenaltyOnScaledGrads(Rule):
    """
    ## What it does
    Finds `torch.autograd.grad(S.scale(loss), ...)`, for a GradScaler `S`, whose gradients then
    go into a loss (a penalty such as the gradient norm added to it, backpropagated with
    `.backward()` or scaled by `S.scale(...)`) without being multiplied by
    `1.0 / S.get_scale()` or divided by `S.get_scale()` first. The scaled value may be given
    directly, through a name assigned `S.scale(...)`, or to a helper of the same file that
    calls `torch.autograd.grad` on its parameter.

    ## Why is this bad?
    `torch.autograd.grad` of a scaled loss returns gradients multiplied by the loss scale
    (65536 at first, then whatever the scaler has moved it to). A penalty built from them — a
    gradient norm, WGAN-GP's `(‖∇D‖ - 1)²`, an R1 term — is off by that factor (or its
    square), swamps the rest of the loss, and changes whenever the scaler grows or backs off
    the scale. These gradients belong to no optimizer, so `S.unscale_(optimizer)` does not
    unscale them.

    ## Example
    ```python
    grad_params = torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True)
    with torch.autocast("cuda"):
        grad_norm = sum(g.pow(2).sum() for g in grad_params).sqrt()
        loss = loss + grad_norm
    scaler.scale(loss).backward()
    ```

    ## Fix
    Unscale the gradients before building the penalty, as PyTorch's AMP examples do
    ("Gradient penalty"), and compute the penalty under autocast:
    ```python
    scaled_grad_params = torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True)
    inv_scale = 1.0 / scaler.get_scale()
    grad_params = [p * inv_scale for p in scaled_grad_params]
    with torch.autocast("cuda"):
        grad_norm = sum(g.pow(2).sum() for g in grad_params).sqrt()
        loss = loss + grad_norm
    scaler.scale(loss).backward()
    ```

    ## Fix safety
    No automatic fix: where to unscale (the gradients, or a norm built from them) is the
    author's choice.

    ## False positives
    A GradScaler is recognised as in AMP007: a name or attribute assigned
    `torch.amp.GradScaler(...)`, the receiver `S` of `S.scale(loss).backward()` or of
    `S.unscale_`, or a parameter named `scaler`, `grad_scaler` or `amp_scaler`. The gradients
    are followed through the names they are assigned to, in source order, within the function
    that computes them, and one call level across functions of the same file: into a helper
    (`f(...)` or `self.m(...)`) that receives the scaled value and calls `torch.autograd.grad`
    on its parameter, and from a function that returns the gradients (or a penalty built from
    them) to its callers in the file; no further, and not across files. They count as
    unscaled once multiplied or divided by anything that reads `S.get_scale()` or is named
    like the scale (`inv_scale`, `loss_scale`), in place too (`g.mul_(inv_scale)`,
    `torch._foreach_div_(grads, scale)`), or given with the scaler or the scale to a call
    (which may unscale them). They go into a loss when something computed from them is
    backpropagated, scaled, or assigned to a name like `loss`, `d_loss`, `loss_D` or
    `D_cost`; a value read with `.item()`, `.detach()` or `float()` only for logging does not,
    nor what the scale does not change: a sign (an adversarial step `x + eps * g.sign()`), a
    direction (`g / g.norm()`, `F.normalize(g)`).
    """

    code = "AMP021"
    name = "gradient-penalty-on-scaled-grads"
    summary = "Gradient penalty built from `torch.autograd.grad(scaler.scale(loss), ...)` without unscaling"
    # `grad`: every spelling of torch.autograd.grad (`torch.autograd.grad`, `autograd.grad`,
    # `from torch.autograd import grad`, and an alias's import); `.scale(`: the scaled value.
    fragments = (("grad", r"\.scale\("),)

    valid = (
        # PyTorch's AMP examples, "Gradient penalty", as written there.
        Valid("""
import torch
from torch.amp import GradScaler, autocast

scaler = GradScaler()

for epoch in epochs:
    for input, target in data:
        optimizer.zero_grad()
        with autocast(device_type='cuda', dtype=torch.float16):
            output = model(input)
            loss = loss_fn(output, target)

        # Scales the loss for autograd.grad's backward pass, producing scaled_grad_params
        scaled_grad_params = torch.autograd.grad(outputs=scaler.scale(loss),
                                                 inputs=model.parameters(),
                                                 create_graph=True)

        # Creates unscaled grad_params before computing the penalty. scaled_grad_params are
        # not owned by any optimizer, so ordinary division is used instead of scaler.unscale_:
        inv_scale = 1./scaler.get_scale()
        grad_params = [p * inv_scale for p in scaled_grad_params]

        # Computes the penalty term and adds it to the loss
        with autocast(device_type='cuda', dtype=torch.float16):
            grad_norm = 0
            for grad in grad_params:
                grad_norm += grad.pow(2).sum()
            grad_norm = grad_norm.sqrt()
            loss = loss + grad_norm

        # Applies scaling to the backward call as usual.
        # Accumulates leaf gradients that are correctly scaled.
        scaler.scale(loss).backward()

        # may unscale_ here if desired (e.g., to allow clipping unscaled gradients)

        # step() and update() as usual
        scaler.step(optimizer)
        scaler.update()
"""),
        # The gradients of the unscaled loss: nothing to unscale.
        Valid("""
import torch

scaler = torch.amp.GradScaler("cuda")
for images, labels in loader:
    with torch.autocast("cuda"):
        loss = criterion(model(images), labels)
    grads = torch.autograd.grad(loss, model.parameters(), create_graph=True)
    penalty = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    scaler.scale(loss + 0.1 * penalty).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""),
        # Scaled gradients read only for a log: no penalty.
        Valid("""
import torch

def train_step(model, batch, optimizer, scaler, writer, step):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(**batch).loss
    grads = torch.autograd.grad(scaler.scale(loss), model.parameters(), retain_graph=True)
    scaled_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    writer.add_scalar("grad_norm/scaled", scaled_norm.item(), step)
    print(f"step {step}: loss {loss.item():.4f}, scaled grad norm {float(scaled_norm):.1f}")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""),
        # Divided by the scale before the penalty: directly, and in place in a helper's loop.
        Valid("""
import torch
from torch import autograd

class WGANGP:
    def __init__(self, critic, opt):
        self.critic, self.opt = critic, opt
        self.scaler = torch.amp.GradScaler()

    def penalty(self, real, fake):
        alpha = torch.rand(real.size(0), 1, 1, 1, device=real.device)
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        with torch.autocast("cuda"):
            out = self.critic(mixed)
        (grad,) = autograd.grad(self.scaler.scale(out.sum()), mixed, create_graph=True)
        grad = grad / self.scaler.get_scale()
        with torch.autocast("cuda"):
            return ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()

    def r1(self, real):
        real.requires_grad_(True)
        with torch.autocast("cuda"):
            out = self.critic(real)
        grads = autograd.grad(self.scaler.scale(out.sum()), [real], create_graph=True)
        scale = self.scaler.get_scale()
        for g in grads:
            g.div_(scale)
        return sum(g.pow(2).flatten(1).sum(1).mean() for g in grads)

    def step(self, real, fake):
        with torch.autocast("cuda"):
            loss_d = self.critic(fake).mean() - self.critic(real).mean()
        loss_d = loss_d + 10.0 * self.penalty(real, fake) + 5.0 * self.r1(real)
        self.scaler.scale(loss_d).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
"""),
        # A helper given the scaled loss and the scale unscales the gradients itself; another
        # caller gives it a loss no scaler touched.
        Valid("""
import torch

def grad_norm_penalty(outputs, params, inv_scale=1.0):
    grads = torch.autograd.grad(outputs, params, create_graph=True)
    grads = [g * inv_scale for g in grads]
    return torch.sqrt(sum((g ** 2).sum() for g in grads))

def amp_step(model, x, y, opt, scaler):
    with torch.autocast("cuda"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    penalty = grad_norm_penalty(scaler.scale(loss), list(model.parameters()), 1.0 / scaler.get_scale())
    scaler.scale(loss + 0.01 * penalty).backward()
    scaler.step(opt)
    scaler.update()

def fp32_step(model, x, y, opt):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss = loss + 0.01 * grad_norm_penalty(loss, list(model.parameters()))
    loss.backward()
    opt.step()
"""),
        # A project's own loss scaler, not torch's GradScaler.
        Valid("""
import torch

class Trainer:
    def __init__(self, model):
        self.model = model
        self.loss_scaler = DynamicLossScaler(init_scale=2 ** 16)

    def step(self, x):
        loss = self.model(x).mean()
        grads = torch.autograd.grad(self.loss_scaler.scale(loss), self.model.parameters(), create_graph=True)
        loss = loss + sum(g.norm() for g in grads)
        self.loss_scaler.scale(loss).backward()
"""),
    )
    invalid = (
        # The docs' loop without the unscaling.
        Invalid("""
import torch

scaler = torch.amp.GradScaler("cuda")
for inputs, targets in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(inputs), targets)
    grad_params = torch.autograd.grad(outputs=scaler.scale(loss), inputs=model.parameters(), create_graph=True)
    with torch.autocast("cuda", dtype=torch.float16):
        grad_norm = 0
        for grad in grad_params:
            grad_norm += grad.pow(2).sum()
        grad_norm = grad_norm.sqrt()
        loss = loss + grad_norm
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""", at=((9, 19, "`torch.autograd.grad` of `scaler.scale(loss)` returns gradients multiplied by the loss scale, "
                 "and line 15 adds a penalty built from them to `loss` without dividing by `scaler.get_scale()`"),)),
        # WGAN-GP's critic step, the scaled critic output held in a name first.
        Invalid("""
import torch

def critic_step(critic, real, fake, optimizer, scaler, lambda_gp=10.0):
    alpha = torch.rand(real.size(0), 1, 1, 1, device=real.device)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    with torch.autocast("cuda"):
        critic_mixed = critic(mixed)
        wasserstein = critic(fake).mean() - critic(real).mean()
    scaled_out = scaler.scale(critic_mixed.sum())
    (grad,) = torch.autograd.grad(scaled_out, mixed, create_graph=True)
    with torch.autocast("cuda"):
        penalty = ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    scaler.scale(wasserstein + lambda_gp * penalty).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
""", at=((11, 15, "`torch.autograd.grad` of `scaled_out` (`scaler.scale(critic_mixed.sum())`) returns gradients "
                  "multiplied by the loss scale, and line 14 backpropagates a penalty built from them"),)),
        # R1 regularization through a helper of the file that takes the scaled value.
        Invalid("""
import torch
import torch.nn.functional as F
from torch import autograd

def input_gradients(outputs, inputs):
    return autograd.grad(outputs=outputs, inputs=inputs, create_graph=True)[0]

class R1Trainer:
    def __init__(self, disc, opt, gamma=10.0):
        self.disc, self.opt, self.gamma = disc, opt, gamma
        self.scaler = torch.amp.GradScaler()

    def disc_step(self, real):
        real.requires_grad_(True)
        with torch.autocast("cuda"):
            logits = self.disc(real)
            loss = F.softplus(-logits).mean()
        grads = input_gradients(self.scaler.scale(logits.sum()), real)
        r1 = grads.pow(2).flatten(1).sum(1).mean()
        loss = loss + 0.5 * self.gamma * r1
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
""", at=((19, 17, "`input_gradients(...)` runs `torch.autograd.grad` (line 7) of `self.scaler.scale(logits.sum())`, "
                  "which returns gradients multiplied by the loss scale, and line 21 adds a penalty built from them "
                  "to `loss` without dividing by `self.scaler.get_scale()`"),)),
        # A penalty helper that scales inside; its caller adds the penalty to the loss.
        Invalid("""
import torch
from torch.autograd import grad

def gradient_penalty(critic, real, fake, scaler):
    eps = torch.rand(real.size(0), 1, device=real.device)
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    with torch.autocast("cuda"):
        scores = critic(mixed)
    grads = grad(scaler.scale(scores.sum()), mixed, create_graph=True)[0]
    return ((grads.norm(2, dim=1) - 1) ** 2).mean()

def train(critic, gen, loader, opt_d, scaler, z_dim=128):
    for real in loader:
        fake = gen(torch.randn(real.size(0), z_dim, device=real.device)).detach()
        with torch.autocast("cuda"):
            d_loss = critic(fake).mean() - critic(real).mean()
        d_loss += 10.0 * gradient_penalty(critic, real, fake, scaler)
        opt_d.zero_grad()
        scaler.scale(d_loss).backward()
        scaler.step(opt_d)
        scaler.update()
""", at=((10, 13, "line 18 adds a penalty built from them to `d_loss`"),)),
    )

    def check(self, ctx: AstContext) -> None:
        if not ctx.outline.method_calls("scale"):  # every finding starts from `S.scale(...)`
            return
        for call in sorted(ctx.outline.calls_to(_GRAD), key=ctx.order):
            outputs = (bind(call, _GRAD_PARAMETERS) or {}).get("outputs")
            found = scaled(ctx, outputs)
            scope = _scope(ctx, call)
            if found is not None:
                use = _Gradients(ctx, scope, call).follow()
                if use is not None and use.sink is None and use.returned:
                    # returned: the first caller in the file that puts what it returns into a loss
                    callers = calls_of(ctx, scope) if not isinstance(scope, ast.Module) else ()
                    use = next((u for c in callers if (u := _Gradients(ctx, _scope(ctx, c), c).follow()) is not None
                                and u.sink is not None), None)
                if use is not None and use.sink is not None:
                    self._report(ctx, call, call, outputs, found, use)
            elif not isinstance(scope, ast.Module):
                self._through_helper(ctx, call, outputs, scope)

    def _through_helper(self, ctx: AstContext, call: ast.Call, outputs: ast.expr | None,
                        function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """``call`` runs on a parameter of ``function``: its callers that give it a scaled value."""
        values = unstarred(outputs.elts) if isinstance(outputs, (ast.List, ast.Tuple)) else [outputs]
        parameters = [v.id for v in values if isinstance(v, ast.Name) and value_before(ctx, v) is None]
        if not parameters:
            return
        inside: _Use | None = None
        params = [p.arg for p in named_parameters(function.args)]
        for caller in calls_of(ctx, function):
            given = bind(caller, params[1:] if isinstance(caller.func, ast.Attribute) else params) or {}
            found = next((s for p in parameters if p in given if (s := scaled(ctx, given[p])) is not None), None)
            if found is None:
                continue
            if inside is None:
                inside = _Gradients(ctx, function, call).follow() or _Use()
            use = inside
            if use.sink is None and use.returned:
                use = _Gradients(ctx, _scope(ctx, caller), caller).follow()
            if use is not None and use.sink is not None:
                self._report(ctx, caller, call, None, found, use)

    @staticmethod
    def _report(ctx: AstContext, at: ast.Call, grad: ast.Call, outputs: ast.expr | None, found: Scaled,
                use: _Use) -> None:
        s = found.scaler
        scaled_code = ctx.code(found.call)
        if at is grad:
            of = f"`{scaled_code}`" if outputs is found.call or outputs is None \
                else f"`{ctx.code(outputs)}` (`{scaled_code}`)"
            what = f"`torch.autograd.grad` of {of} returns"
        else:
            what = (f"`{ctx.code(at.func)}(...)` runs `torch.autograd.grad` (line {line_of(ctx, grad)}) of "
                    f"`{scaled_code}`, which returns")
        line = line_of(ctx, use.sink)
        ctx.report(at, f"{what} gradients multiplied by the loss scale, and line {line} {use.what} without "
                       f"dividing by `{s}.get_scale()`: the penalty is off by the scale and moves with it; "
                       f"multiply the gradients by `1.0 / {s}.get_scale()` first",
                   related=(Related(ctx.path, line, "the penalty built from the scaled gradients"),))
