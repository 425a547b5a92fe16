from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.half_models import Half, made_float32_here, made_half_here
from ..engine.rule import Invalid, Rule, Valid
from ..engine.summaries import checked_module, is_backward, receiver

# torch.optim's modules that hold no optimizer classes.
_NOT_OPTIMIZERS = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")
_PARAMETERS = frozenset({"parameters", "named_parameters"})
# Calls that pass the parameters they are given through unchanged.
_PASS_THROUGH = frozenset({"filter", "list", "tuple", "itertools.chain", "itertools.chain.from_iterable"})


def _bindings(ctx: AstContext, node: ast.AST) -> dict[str, list[tuple[str, ast.expr]]]:
    """What each name of ``node``'s function (or the top level) is bound to (``bindings``)."""
    module = checked_module(ctx)
    return module.bindings(ctx.enclosing_function(node) or ctx.outline.tree) if module is not None else {}


def _refers_to_torch_optim(ctx: AstContext) -> bool:
    """A name or attribute that stands for ``torch.optim`` or something in it: where there is
    none, no optimizer class is built (``_optimizer_class``)."""
    outline = ctx.outline
    return any(q.startswith("torch.optim") for kind in (ast.Name, ast.Attribute)
               for n in outline.nodes(kind) for q in outline.qualified_names(n))


def _optimizer_class(ctx: AstContext, func: ast.expr, depth: int = 2) -> bool:
    """``torch.optim.AdamW``, ``getattr(torch.optim, name)``, or a local bound to either."""
    names = ctx.outline.qualified_names(func)
    if any(n.startswith("torch.optim.") and not n.startswith(_NOT_OPTIMIZERS) for n in names):
        return True
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" and func.args:
        return "torch.optim" in ctx.outline.qualified_names(func.args[0])
    if isinstance(func, ast.Name) and depth:
        bound = _bindings(ctx, func).get(func.id, [])
        return len(bound) == 1 and bound[0][0] == "value" and _optimizer_class(ctx, bound[0][1], depth - 1)
    return False


def _owners(ctx: AstContext, expr: ast.expr, seen: set[str]) -> set[str]:
    """The models whose own parameters ``expr`` holds (``model.parameters()``, a filter or list of
    them, param groups, lists filled in a loop over ``named_parameters()``). A copy of them
    (``p.detach().clone().float()``) is no model's: that is a float32 master copy."""
    if isinstance(expr, ast.Starred):
        expr = expr.value
    if isinstance(expr, ast.Call):
        found = receiver(expr)
        if found is not None and found[1] in _PARAMETERS:
            return {ctx.code(found[0])}
        if ctx.code(expr.func) in _PASS_THROUGH or ctx.outline.qualified_names(expr.func) & _PASS_THROUGH:
            return set().union(*(_owners(ctx, a, seen) for a in expr.args))
        return set()
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        return set().union(*(_owners(ctx, e, seen) for e in expr.elts))
    if isinstance(expr, ast.Dict):
        return set().union(*(_owners(ctx, v, seen) for k, v in zip(expr.keys, expr.values) if k is not None))
    if isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        target, elt = expr.generators[0].target, expr.elt
        if isinstance(elt, ast.Name) and (ctx.code(target) == elt.id or isinstance(target, ast.Tuple) and
                                          elt.id in {ctx.code(e) for e in target.elts}):
            return _owners(ctx, expr.generators[0].iter, seen)
        return set()
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _owners(ctx, expr.left, seen) | _owners(ctx, expr.right, seen)
    if isinstance(expr, ast.Name) and expr.id not in seen:
        seen.add(expr.id)
        return set().union(*(_owners(ctx, value, seen) for _, value in _bindings(ctx, expr).get(expr.id, [])))
    return set()


def _model_key(ctx: AstContext, node: ast.AST, model: str) -> tuple[int, str]:
    """Where the spelling ``model`` names one model: ``self.model`` throughout its class, a
    local throughout its function."""
    function = ctx.enclosing_function(node)
    if function is None:
        return 0, model
    owner = ctx.parent(function)
    first = function.args.args[0].arg if function.args.args else None
    if isinstance(owner, ast.ClassDef) and first is not None and model.split(".")[0].strip() == first and "." in model:
        return id(owner), model.replace(first, "self", 1)
    return id(function), model


def _params_argument(call: ast.Call) -> ast.expr | None:
    positional = next((a for a in call.args if not isinstance(a, ast.Starred)), None)
    return positional if positional is not None else next((k.value for k in call.keywords if k.arg == "params"), None)


def _wrapped(ctx: AstContext, call: ast.Call) -> bool:
    """An optimizer handed to something that keeps master weights for it: built inside another
    call (``FP16_Optimizer(torch.optim.Adam(...))``), or its variable rebound by a call that
    takes it (``optimizer = Wrapper(optimizer)``, ``model, optimizer = amp.initialize(model,
    optimizer)``). Schedulers take the optimizer too, but are bound to other names."""
    parent = ctx.parent(call)
    if isinstance(parent, ast.keyword) or isinstance(parent, ast.Call) and call in parent.args:
        return True
    if not isinstance(parent, ast.Assign):
        return False
    variables = {ctx.code(t) for t in parent.targets}
    return any(other is not parent and targets & variables
               and any(ctx.code(a) in variables for a in (*other.value.args, *(k.value for k in other.value.keywords)))
               for other, targets in _rebindings(ctx))


def _rebindings(ctx: AstContext) -> list[tuple[ast.Assign, set[str]]]:
    """Each assignment of a call's result, with the code of what it binds (the elements of a
    tuple target too): spelled out once per file, not once per optimizer."""
    if "_amp016_rebindings" not in ctx.__dict__:
        ctx.__dict__["_amp016_rebindings"] = [
            (other, {ctx.code(t) for t in other.targets} | {
                ctx.code(e) for t in other.targets if isinstance(t, (ast.Tuple, ast.List)) for e in t.elts})
            for other in ctx.outline.nodes(ast.Assign) if isinstance(other.value, ast.Call)]
    return ctx.__dict__["_amp016_rebindings"]


_PRECISION = ("utils/precision.py", """\
import copy
import torch

def build_model(cfg):
    dtype = torch.float16 if cfg.fp16 else torch.float32
    return Net(cfg).cuda().to(dtype)

def export_half(model):
    return copy.deepcopy(model).half()

class HalfMixin:
    def to_half_precision(self):
        self.half()
""")


class HalfModelTrained(Rule):
    """
    ## What it does
    Finds a `torch.optim` optimizer built over the parameters of a model that the file
    converts to float16 (`model.half()`, `model.to(torch.float16)`, `self.model =
    self.model.half()` under a config flag, `model.to(dtype)` with `dtype = torch.float16 if
    args.fp16 else torch.float32`), or that a function of the project converts, up to three
    calls deep and in another module: a factory that returns the model it made half (`model =
    build_model(cfg)`), a helper that converts its argument (`convert_to_fp16(model)`), or a
    method of the model's class, or of a base class of the project (`model.to_half_precision()`
    where `model = Net(...)`), in a file that runs a backward pass. The optimizer class may
    come straight from `torch.optim`, from a variable holding it, or from `getattr(torch.optim,
    name)`; its parameters may be `model.parameters()`, a filter or list of them, or param
    groups filled in a loop over `model.named_parameters()`. The finding sits on the optimizer
    and names the conversion (and the call that leads to it), and the switch it applies under
    (`if args.fp16:`, the flag that chooses the dtype, a helper's parameter answered by what
    the call passes).

    ## Why is this bad?
    Pure float16 training keeps the weights themselves in float16: updates smaller than the
    weight's precision (about 1e-3 relative) round away, so learning stalls, the optimizer's
    state (Adam's moments) is float16 too, and gradients underflow with no loss scaling (a
    loss scaler alone does not restore the lost updates). Mixed precision keeps float32
    master weights and runs only the ops that benefit in float16.

    ## Example
    ```python
    model = Net().cuda().half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Fix
    ```python
    model = Net().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    # and run the forward under torch.autocast("cuda")
    ```
    or keep float32 master weights: give the optimizer float32 copies of the parameters and
    copy the updated values back into the float16 model after each step.

    ## Fix safety
    No automatic fix.

    ## False positives
    `.half()` for inference (no optimizer over that model's parameters) is not reported. Nor
    is an optimizer that gets float32 master weights: copies of the parameters
    (`[p.detach().clone().float() for p in model.parameters()]`) rather than the parameters
    themselves, or an optimizer handed to a wrapper that keeps master weights, built inside
    its call (`FP16_Optimizer(torch.optim.Adam(...))`) or rebound to its result (`optimizer =
    wrap(optimizer)`, `model, optimizer = amp.initialize(model, optimizer)`). The model is
    matched by its spelling (`self.model`) within the file, in any branch and either order:
    `.half()` converts the parameters in place, so an optimizer built before it trains them
    in float16 too. A helper is followed only where the code shows which function runs (a
    method, where the object's class is shown by the name's only binding): a helper that
    returns a float16 copy (`copy.deepcopy(model).half()`) leaves the trained model float32,
    and one whose conversion depends on an argument the call rules out (`mode="train"` for `if
    mode == "export":`) is not reported, nor a model the file converts back to float32
    anywhere (`model.float()`). A GradScaler does not silence it: it scales the loss,
    it keeps no float32 weights (and refuses to unscale float16 gradients).
    """

    code = "AMP016"
    preview_paths = ("a model made half (or a helper that makes it half called) in another function than the "
                     "one that builds its optimizer (an evaluation method, a helper) runs")
    name = "half-model-trained"
    summary = "Optimizer over the parameters of a model converted to float16 (no float32 master weights)"
    # An optimizer and a backward pass: the model may be made half by another module.
    fragments = (("optim", "backward"), ("backward", "optim"))
    valid = (
        Valid("""
import torch
model = Net().cuda().half().eval()
with torch.no_grad():
    out = model(x.half())
"""),
        Valid("""
import torch
model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters())
x = x.half()
loss = model(x.float()).mean()
loss.backward()
"""),
        # float32 master weights: the optimizer updates copies, which are copied back.
        Valid("""
import torch
model = Net().cuda().half()
master = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
optimizer = torch.optim.SGD(master, lr=0.1)
model(x).mean().backward()
for p, m in zip(model.parameters(), master):
    m.grad = p.grad.float()
optimizer.step()
"""),
        # A wrapper that keeps master weights.
        Valid("""
import torch
from apex.fp16_utils import FP16_Optimizer
model = Net().cuda().half()
optimizer = torch.optim.Adam(model.parameters())
optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
optimizer.backward(model(x).mean())
optimizer.step()
"""),
        # The helper returns a float16 copy; the model trained stays float32.
        Valid("""
import torch
from utils.precision import export_half
model = Net().cuda()
optimizer = torch.optim.AdamW(model.parameters())
model(x).mean().backward()
optimizer.step()
torch.onnx.export(export_half(model), x.half(), "model.onnx")
""", project=(_PRECISION,)),
    )
    invalid = (
        Invalid("""
import torch
model = Net().cuda()
model.half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = loss_fn(model(x.cuda().half()), y)
    loss.backward()
    optimizer.step()
""", at=((5, 13, "the float16 parameters of `model` (`model.half()` on line 4)"),)),
        Invalid("""
import torch
def build(net):
    net = net.to(dtype=torch.float16)
    opt = torch.optim.Adam(net.parameters())
    return net, opt
def train(net, opt, x):
    net(x).mean().backward()
    opt.step()
""", at=((5, 11, "the float16 parameters of `net` (`net.to(dtype=torch.float16)` on line 4)"),)),
        # A model attribute halved under a config flag; param groups filled from named_parameters.
        Invalid("""
import torch.optim as optim
class Trainer:
    def __init__(self, model, config):
        self.model = model.cuda()
        if config.fp16:
            self.model = self.model.half()
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if p.ndim == 1:
                no_decay.append(p)
            else:
                decay.append(p)
        groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = optim.AdamW(groups, lr=config.lr)

    def step(self, batch):
        self.model(batch).mean().backward()
        self.optimizer.step()
""", at=((15, 26, "the float16 parameters of `self.model` (`self.model.half()` on line 7)"),)),
        # The optimizer class looked up by name.
        Invalid("""
import torch
model = Net().cuda().half()
optimizer_class = getattr(torch.optim, config.optimizer)
optimizer = optimizer_class(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-3)
model(x).mean().backward()
optimizer.step()
""", at=((5, 13, "the float16 parameters of `model` (`Net().cuda().half()` on line 3)"),)),
        # A factory of another module returns the model made half when a config key is set; a
        # method of a project base class of the model converts it.
        Invalid("""
import torch
from utils.precision import build_model, HalfMixin
class Head(HalfMixin, torch.nn.Module):
    pass
model = build_model(cfg)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
head = Head()
head.to_half_precision()
head_optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
head(model(x)).mean().backward()
""", at=((7, 13, "(`build_model(...)` on line 6 returns it made float16: `Net(cfg).cuda().to(dtype)`, "
                 "utils/precision.py:6), when `cfg.fp16` is true"),
         (10, 18, "(`head.to_half_precision(...)` on line 9 makes it float16: `self.half()`, utils/precision.py:13)")),
                project=(_PRECISION,)),
    )

    def check(self, ctx: AstContext) -> None:
        all_calls = sorted(ctx.outline.nodes(ast.Call), key=ctx.order)
        if not any(is_backward(ctx.outline, c) for c in all_calls) or not _refers_to_torch_optim(ctx):
            return
        optimizers = []
        for call in all_calls:
            params = _params_argument(call)
            if params is not None and _optimizer_class(ctx, call.func) and not _wrapped(ctx, call):
                keys = {_model_key(ctx, call, m) for m in _owners(ctx, params, set())}
                if keys:
                    optimizers.append((call, keys))
        if not optimizers:
            return
        wanted = set().union(*(keys for _, keys in optimizers))
        halved: dict[tuple[int, str], Half] = {}
        restored: set[tuple[int, str]] = set()  # converted back to float32 somewhere: not shown half when trained
        for call in all_calls:
            for name, half in made_half_here(ctx, call, lambda n, at=call: _model_key(ctx, at, n) in wanted):
                halved.setdefault(_model_key(ctx, call, name), half)
            restored |= {_model_key(ctx, call, name) for name in made_float32_here(ctx, call)}
        for call, keys in optimizers:
            keys &= halved.keys() - restored
            if keys:
                key = min(keys, key=lambda k: ctx.order(halved[k].node))
                half = halved[key]
                # Made half earlier in the function that builds the optimizer: one path does both.
                # From another function, the conversion may sit on a path training never takes.
                elsewhere = ctx.enclosing_function(half.node) is not ctx.enclosing_function(call) \
                    or ctx.order(half.node) > ctx.order(call)
                when = f", {half.switch.when}" if half.switch else ""
                ctx.report(call, f"this optimizer updates the float16 parameters of `{key[1]}` ({half.says}){when}: "
                                 "without float32 master weights updates round away; keep the model in float32 and "
                                 "use autocast + GradScaler, or give the optimizer a float32 copy of the parameters",
                           preview=elsewhere, related=(*half.related, *(half.switch.related if half.switch else ())))
