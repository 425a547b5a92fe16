from __future__ import annotations

import ast

from ..engine.ast_context import AstContext
from ..engine.crossfile import named_loss_place
from ..engine.enabling import enabling_site
from ..engine.diagnostics import Related
from ..engine.dtypes import call_spelling, inferred_dtype, tensor_input
from ..engine.enabling import region_switch
from ..engine.epsilons import (
    Epsilons,
    bound_values,
    caller_zero,
    computed_from,
    guard,
    guarded_op,
    halved_classes,
    parenthesized_code,
    references_to,
    tested_positive,
    widens,
)
from ..engine.outline import contains
from ..engine.promotion import FP32_FAMILY, policies_of
from ..engine.region_tables import region_dtype, region_table
from ..engine.regions import reaching_region
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..policy import PolicyError

_EPS_KEYWORDS = frozenset({"eps", "epsilon", "min"})
# Names a function that deals with float16 itself mentions (_handles_half).
_HALF_AWARE = frozenset({"torch.float16", "torch.half", "torch.finfo"})
# Name parts of what a data loader gives (in float32, whatever autocast runs).
_GROUND_TRUTH = frozenset({"gt", "target", "targets", "label", "labels", "truth"})
# Methods whose result is a Python number or an integer count, not a float16 tensor.
_COUNTS = frozenset({"item", "size", "numel", "dim", "long", "int", "count_nonzero", "tolist"})
_MESSAGE = "is below float16's smallest value (≈5.96e-8) and rounds to 0"
# Every finding is on a float literal below 2**-24 (about 5.96e-8), or on a name bound to
# one: one mark for every way to write one, as mantissa M times 10**E: an exponent E <= -8
# (`1e-8`, `5E-0_9`), its `e` after a digit or a point (not the `-14B` of `Animate-14B`); for
# -7 <= E <= -1, M < 1, so a fraction (`0.5e-7`, `.3e-7`); else M itself below 1e-7, with
# seven zeros after its point (`0.000_000_05`). Each starts with a literal, which the regex
# engine scans for; a number's point is `[.]`, which no space may follow (an attribute's `\.`
# may: the prefilter lets blanks around it).
_TINY = AnyOf(r"e-(?<=[\d.]e-)[0_]*(?:[89]|[1-9]_?\d)", r"E-(?<=[\d.]E-)[0_]*(?:[89]|[1-9]_?\d)",
              r"[.]\d[\d_]*[eE]-[0_]*[1-7](?![\d_])", r"[.]0(?:_?0){6}")


def _handles_half(ctx: AstContext, function: ast.AST) -> bool:
    """The function deals with float16 itself (``torch.float16``, ``torch.finfo``): its
    author chose what happens there."""
    if "_half_aware" not in ctx.__dict__:
        ctx.__dict__["_half_aware"] = references_to(ctx, _HALF_AWARE)
    return any(contains(function, node) for node in ctx.__dict__["_half_aware"])


def _private(ctx: AstContext, function: ast.AST) -> bool:
    """A helper named ``_like_this`` (or in such a class): its callers in the project decide
    its dtypes, which one file does not show."""
    names = [function.name]
    parent = ctx.parent(function)
    while parent is not None:
        if type(parent) is ast.ClassDef:
            names.append(parent.name)
        parent = ctx.parent(parent)
    return any(n.startswith("_") and not n.endswith("__") for n in names)


def _number(expr: ast.expr) -> bool:
    """A Python number: a counter started at 0, a size, a count."""
    if type(expr) is ast.Constant:
        return type(expr.value) is int
    if type(expr) in (ast.Tuple, ast.List):  # `count_a, count_b = 0, 0`
        return bool(expr.elts) and all(_number(e) for e in expr.elts)
    if type(expr) is ast.Call:
        return type(expr.func) is ast.Attribute and expr.func.attr in _COUNTS \
            or type(expr.func) is ast.Name and expr.func.id == "len"
    return False


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
    calls whose ops autocast runs in float32 (`F.layer_norm(..., eps=1e-12)`), or of an op it
    leaves alone on a value that is float32 there (`torch.clamp(mask.float().sum(1), min=1e-9)`). Operands of
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
    preview_fragments = ((_TINY,),)
    # Outside preview the guarded value's float16 is shown in the file: a torch autocast
    # region, or a class the file makes half (`.half()`, `.to(torch.float16)`).
    fragments = ((_TINY, AnyOf(r"\.half\b", "float16", "autocast")),)

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
        # A clamp autocast leaves alone, of a float32 value: the mask's count.
        Valid("""
import torch
def mean_pool(hidden, mask):
    with torch.autocast("cuda"):
        weights = mask.unsqueeze(-1).float()
        return (hidden * weights).sum(1) / torch.clamp(weights.sum(1), min=1e-9)
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

    def check(self, ctx: AstContext) -> None:
        found = Epsilons(ctx)
        if not found.literals:  # every finding rests on a tiny literal (the fragments' marks may be in text)
            return
        candidates = (*found.literals, *found.references)
        # In a float16 region: an operand of arithmetic, an `eps=` argument.
        for node in candidates:
            parent = ctx.parent(node)
            if type(parent) is ast.BinOp and found.of(node) is not None:
                self._check_operand(ctx, node, parent.left if parent.right is node else parent.right)
            elif type(parent) is ast.keyword and parent.arg in _EPS_KEYWORDS and found.of(node) is not None:
                self._check_keyword(ctx, parent)
        # Outside regions: a guard of a division, log or root.
        halved = None
        for node in candidates:
            guarded, function = guard(ctx, node), ctx.enclosing_function(node)
            if guarded is None or function is None or (eps := found.of(node)) is None \
                    or reaching_region(ctx, node) is not None:
                continue
            owner = ctx.enclosing(node, ast.ClassDef)
            halved = halved_classes(ctx) if halved is None else halved
            origin = "" if eps[1] is node else f" (line {eps[1].lineno})"
            if owner is not None and owner.name in halved:
                self._check_half_model(ctx, node, origin, guarded, function, owner.name, halved[owner.name])
            elif ctx.preview and not self._check_caller_dtype(ctx, node, origin, guarded, function):
                self._check_project_float16(ctx, node, origin, guarded, function)  # both report in preview only

    def _check_half_model(self, ctx: AstContext, eps: ast.expr, origin: str, guarded: tuple[ast.expr, ast.expr],
                          function: ast.AST, owner: str, half: ast.Call) -> None:
        """In a class whose instances this file converts to float16: every guard there runs in
        float16 unless the computation is widened first."""
        if guarded_op(ctx, guarded[0], function) is None:
            return
        bound = bound_values(ctx, function)
        if any(type(n) is ast.Call and widens(ctx, n, bound) for n in computed_from(ctx, guarded[1], function)):
            return
        ctx.report(eps, f"`{parenthesized_code(ctx, eps)}`{origin} {_MESSAGE} in `{owner}`, which "
                        f"`{parenthesized_code(ctx, half)}` on line {half.lineno} converts to float16: the guard "
                        "does nothing; use ≥ 1e-6 or compute this step in float32")

    def _check_caller_dtype(self, ctx: AstContext, eps: ast.expr, origin: str, guarded: tuple[ast.expr, ast.expr],
                            function: ast.AST) -> bool:
        """Outside any region: a guard in a function on tensors of its caller's dtype. Whether
        it reports."""
        if _private(ctx, function):
            return False
        op = guarded_op(ctx, guarded[0], function)
        found = caller_zero(ctx, guarded[1], function) if op is not None else None
        if found is None or tested_positive(ctx, eps, guarded[1], function) or _handles_half(ctx, function):
            return False
        tensor, zero = found
        ctx.report(eps, f"`{parenthesized_code(ctx, eps)}`{origin} {_MESSAGE} when this runs in float16 (a "
                        f"float16 `{tensor}` or model), where the {zero} it guards reaches 0: the {op} gives "
                        "inf/NaN; use ≥ 1e-6 (or one from `torch.finfo(x.dtype)`), or compute this step in float32",
                   preview=True)  # no producer makes the caller's tensors half: a guess
        return True

    def _check_project_float16(self, ctx: AstContext, eps: ast.expr, origin: str,
                               guarded: tuple[ast.expr, ast.expr], function: ast.AST) -> None:
        """Outside any region of this file, where a loss is computed (``crossfile.named_loss_place``)
        in a project whose other code enables float16 autocast: a guard of a division, log or
        root of a value nothing on its way makes float32 (an op autocast runs in float32, a
        cast), which runs in float16 when the loss runs in that region."""
        place = named_loss_place(ctx, eps)
        if place is None or _handles_half(ctx, function):
            return
        op = guarded_op(ctx, guarded[0], function)
        found = enabling_site(ctx, float16=True) if op is not None else None
        if found is None:
            return
        site, where, related = found
        try:
            table = ctx.policy(site.device)
        except PolicyError:
            return
        value = guarded[1]
        operands = [value.left, value.right] if type(value) is ast.BinOp else [value]
        if any(inferred_dtype(ctx, o, table, depth=4) == "float32" for o in operands):
            return  # made by an op autocast runs in float32 (a sum, a norm, a softmax), or promoted to it
        bound = bound_values(ctx, function)
        if any(_number(o) or type(o) is ast.Name and any(_number(v) for v in bound.get(o.id, ())) for o in operands):
            return
        computed = list(computed_from(ctx, value, function))
        if any(type(node) is ast.Call and widens(ctx, node, bound) for node in computed):
            return  # cast to float32 on the way: the epsilon survives
        if any(not _GROUND_TRUTH.isdisjoint((n if type(n) is str else n.id).lower().split("_"))
               for n in computed if type(n) in (str, ast.Name)):
            return  # computed from the labels (boxes, targets), which the data loader gives in float32
        ctx.report(eps, f"`{parenthesized_code(ctx, eps)}`{origin} {_MESSAGE} in float16, and this project runs "
                        f"code under float16 autocast ({where}): if {place} runs there, the {op} it guards gives "
                        "inf/NaN at 0; use ≥ 1e-6 or compute this step in float32", related=(related,),
                   preview=True)  # whether that region reaches this code is not shown

    @staticmethod
    def _fp16_region(ctx: AstContext, node: ast.AST):
        """(table, where, related, through a call) of the float16 region ``node`` runs in (around
        it, or around a caller in this file: ``where`` then names it), or None."""
        region = reaching_region(ctx, node)
        if region is None or region[0] is None or region_dtype(ctx, region[0]) != "float16":
            return None
        if region[2] is None:
            return region_table(ctx, region[0]), "in this float16 region", (), False
        line, call = region[1].lineno, region[2].lineno
        switch = region_switch(ctx, region[0])
        when = f" {switch.when}" if switch else ""
        return (region_table(ctx, region[0]),
                f"in float16: this runs under the float16 autocast of line {line}{when}, "
                f"through the call on line {call}",
                (Related(ctx.path, call, "runs it under float16 autocast"), *(switch.related if switch else ())), True)

    def _check_operand(self, ctx: AstContext, literal: ast.expr, other: ast.expr) -> None:
        region = self._fp16_region(ctx, literal)
        # Through a call, what the caller passed is not seen: only an op of this function that
        # autocast lowers shows the value half.
        wanted = ("lowp",) if region is not None and region[3] else ("lowp", None)
        if region is not None and inferred_dtype(ctx, other, region[0]) in wanted:
            ctx.report(literal, f"`{parenthesized_code(ctx, literal)}` {_MESSAGE} {region[1]}: use ≥ 1e-6 or "
                                "compute in float32", related=region[2])

    def _check_keyword(self, ctx: AstContext, keyword: ast.keyword) -> None:
        region = self._fp16_region(ctx, keyword)
        call = ctx.parent(keyword)
        if region is None or type(call) is not ast.Call:
            return
        spelling = call_spelling(ctx, call)
        policies = policies_of(region[0], spelling)
        if policies and policies <= FP32_FAMILY:
            return  # autocast runs this op in float32, where the epsilon survives
        source = tensor_input(call, spelling) if spelling is not None and "lower_precision_fp" not in policies else None
        if source is not None and inferred_dtype(ctx, source, region[0]) == "float32":
            return  # an op autocast leaves alone, on a float32 value (`mask.float().sum(1).clamp(min=1e-9)`)
        ctx.report(keyword.value, f"`{keyword.arg}={parenthesized_code(ctx, keyword.value)}` {_MESSAGE} {region[1]}",
                   related=region[2])
