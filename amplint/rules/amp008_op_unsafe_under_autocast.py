from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import libcst as cst

from ..engine.context import FileContext
from ..engine.crossfile import loss_place
from ..engine.diagnostics import Fix, Related
from ..engine.outline import Outline
from ..engine.reach import used
from ..engine.region_tables import region_table
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import (
    REGION_BOUNDS,
    autocast_of_with_item,
    autocast_region,
    calls,
    method_call,
)
from ..policy import PolicyError, committed_tables

_SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})
_WITH_LOGITS = {"binary_cross_entropy": "binary_cross_entropy_with_logits",
                "BCELoss": "BCEWithLogitsLoss"}


def _constructions(ctx: FileContext) -> dict[str, set[str]]:
    """``name = torch.nn.SomeLoss(...)`` anywhere: what each target was built from."""
    built: dict[str, set[str]] = {}
    for node in ctx.nodes(cst.Assign):
        if isinstance(node.value, cst.Call):
            names = {n for n in ctx.qualified_names(node.value.func) if n.startswith("torch.")}
            for target in node.targets:
                built.setdefault(ctx.code(target.target), set()).update(names)
    return built


def _is_module_class(spelling: str) -> bool:
    return spelling.rsplit(".", 1)[-1][:1].isupper()


def _sigmoid_input(ctx: FileContext, expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """``z`` for ``torch.sigmoid(z)``, ``F.sigmoid(z)`` or ``z.sigmoid()``."""
    if not isinstance(expr, cst.Call):
        return None
    if ctx.resolves_to(expr.func, _SIGMOID) and len(expr.args) == 1 and expr.args[0].keyword is None:
        return expr.args[0].value
    mc = method_call(expr)
    if mc is not None and mc[1] == "sigmoid" and not expr.args:
        return mc[0]
    return None


@lru_cache(maxsize=None)
def _banned_anywhere() -> frozenset[str]:
    """The spellings some committed table bans (read when first asked: not at start-up)."""
    return frozenset(spelling for table in committed_tables() for spelling in table.spellings_with("banned"))


def _disabled_region(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Inside ``with autocast(enabled=False)``: what the region around it runs is out of autocast."""
    ancestor = ctx.enclosing(node, REGION_BOUNDS)
    while ancestor is not None:
        if isinstance(ancestor, cst.With):
            if any((ac := autocast_of_with_item(ctx, item)) is not None and ac.enabled is False
                   for item in ancestor.items):
                return True
        else:  # a function or lambda
            return False
        ancestor = ctx.enclosing(ancestor, REGION_BOUNDS)
    return False


def _loss_place(ctx: FileContext, call: cst.Call) -> str | None:
    """Where a loss is computed, if ``call`` is in one (``crossfile.loss_place``)."""
    return loss_place(ctx, call)


def _used(ctx: FileContext, node: cst.CSTNode) -> bool:
    """Whether the project uses the class or function at the top of this file that ``node`` is
    in (``reach.used``): code nothing uses never runs under another file's autocast."""
    root = ctx.project_root()
    outer = [a for a in ctx.ancestors(node) if isinstance(a, (cst.ClassDef, cst.FunctionDef))]
    if root is None or not outer:
        return True
    read: set = set()
    answer = used(root, Path(ctx.path), outer[-1].name.value, read)
    ctx.dependencies.update(read)
    return answer


def _class_handed_over(ctx: FileContext, call: cst.Call, banned: frozenset[str]):
    """``(reference, spelling)`` for a banned loss class handed to a call uncalled, for that
    call to build it (``BaseLoss(nn.BCELoss, *args, **kwargs)``, ``partial(nn.BCELoss, ...)``);
    not a test of a type (``isinstance(m, nn.BCELoss)``)."""
    if isinstance(call.func, cst.Name) and call.func.value in ("isinstance", "issubclass", "type"):
        return None
    for arg in call.args:
        value = arg.value
        if arg.star or not isinstance(value, (cst.Name, cst.Attribute)):
            continue
        spelling = ctx.resolves_to(value, banned)
        if spelling is not None and _is_module_class(spelling):
            return value, spelling
    return None


def _enabling_site(ctx: FileContext, project, call: cst.Call, spelling_of):
    """(table, spelling, where, related) for the first autocast call of the project whose device's
    table bans what ``call`` reaches; a device that is not a literal is judged with the
    configured device's table."""
    if not project:
        return None
    root, sites = project
    for site in sites:
        try:
            table = ctx.policy(site.device)
        except PolicyError:  # a device the tables do not cover
            continue
        spelling = spelling_of(call, table.spellings_with("banned"))
        if spelling is not None:
            more = len(sites) - 1
            related = Related(site.shown_path(), site.row, f"autocast on ({site.setting})" if site.setting
                              else "autocast entered here")
            return table, spelling, site.where(root) + (f" and {more} more" if more else ""), related
    return None


def _may_fire(outline: Outline) -> bool:
    """A spelling some committed table bans, called, built or handed to a builder here: for a
    region here or elsewhere in the project (a project's own tables are not known here: with
    them, the prefilter does not ask)."""
    banned = _banned_anywhere()
    return bool(outline.calls_to(banned)) or any(
        not outline.qualified_names(a).isdisjoint(banned) for c in outline.nodes(ast.Call) for a in c.args)


class OpUnsafeUnderAutocast(Rule):
    """
    ## What it does
    Inside an enabled autocast region, finds calls that reach an op the policy tables mark
    `banned` for the region's device (for torch 2.13 on cuda, xpu, mtia and maia:
    `aten::binary_cross_entropy`, reached by `torch.nn.functional.binary_cross_entropy` and
    `torch.nn.BCELoss`). Loss modules are followed from where they are built
    (`self.criterion = nn.BCELoss()`) to where they are called. The list of banned ops and
    their spellings comes from `policies/`, not from this rule.

    Also outside any region of the file, where a loss is computed (a module's `forward`, a
    Lightning step hook such as `training_step`, a function or method named like a loss, a
    method of a class named like one) in a project whose other code enables autocast on a
    device that bans the op: the region is where the trainer is, often another file. The
    project is the folder of the nearest `pyproject.toml`, `setup.py`, `setup.cfg` or `.git`,
    else the outermost package holding the file; its autocast calls are found by reading its
    files (those disabled by a literal `enabled=False`, on the CPU, or inside a model's own code
    do not count), and so are the framework settings that make a framework open the region
    itself: Lightning's `Trainer(precision="16-mixed")` (or `"bf16-mixed"`), accelerate's
    `Accelerator(mixed_precision="fp16")`, transformers' `TrainingArguments(fp16=True)` (or
    `bf16=True`), mmcv's `Fp16OptimizerHook(...)`; they are judged with the configured device's
    table. The loss must be in code the project uses (`reach`): its class or function (the
    outermost one around it) is decorated (a registry), named in a config file, in module-level
    code, in a package's `__init__.py` that re-exports it, or in a class or function used
    itself; a class whose `__init__` calls `super(Cls).__init__()` and then assigns a submodule
    can never be built. There, a banned loss class handed uncalled to a call that builds it
    (`BaseLoss(nn.BCELoss, ...)`) counts too; names a module re-exports through
    `from .imports import *` resolve as that module's imports do. The message names the
    autocast call or the setting, which JSON (`related`) and SARIF (`relatedLocations`) also
    give as a location.

    ## Why is this bad?
    The autocast kernel raises: `binary_cross_entropy` "is unsafe to autocast" because its
    backward can produce gradients that float16 cannot represent. The training step crashes
    the first time the region runs on that device.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = F.binary_cross_entropy(torch.sigmoid(logits), targets)
    ```

    ## Fix
    ```python
    with torch.autocast("cuda"):
        loss = F.binary_cross_entropy_with_logits(logits, targets)
    ```

    ## Fix safety
    Safe, for the common pattern only: the input is `torch.sigmoid(z)` (or `z.sigmoid()`) and the
    call is spelled through a module (`F.binary_cross_entropy`, `nn.BCELoss()`), so the
    `_with_logits` name is reachable the same way; it computes the same loss, stably. Other
    arguments (`weight=`, `reduction=`) are kept. Otherwise no fix: compute that loss outside
    the region, in float32.

    ## False positives
    A region whose device is not a literal is judged with the configured device's table.
    Outside the file's regions, how a used loss is reached is not followed: a loss module of a
    project that trains under CUDA autocast is taken to run there (triaged on real projects:
    21 of 22 such findings were right). If it never does (it scores
    an evaluation only, or runs under another precision setting), say so with
    `# noqa: AMP008`, or compute it under `autocast(enabled=False)` on float32 inputs, which
    this rule never reports. A setting read from a configuration file (a YAML `fp16: true`)
    or passed as a variable is not seen.
    """

    code = "AMP008"
    name = "op-unsafe-under-autocast"
    summary = "Op that autocast refuses (banned) called inside an autocast region, here or in the project"
    fixable = True
    uses_policy = True
    # The banned ops' spellings in every committed table (a test keeps this true); and, for
    # a project's own tables ([tool.amplint] policies), the autocast call of a region.
    fragments = (AnyOf("binary_cross_entropy", "BCELoss"), "autocast")
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
loss = F.binary_cross_entropy(torch.sigmoid(logits.float()), y)
"""),
        Valid("""
import torch
from torch import nn
criterion = nn.BCELoss()
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = criterion(torch.sigmoid(model(x)), y)
"""),
        Valid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    loss = F.binary_cross_entropy_with_logits(model(x), y)
"""),
    )
    invalid = (
        Invalid("""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
    loss = F.binary_cross_entropy(torch.sigmoid(logits), y, reduction="sum")
""", fixed="""
import torch
import torch.nn.functional as F
with torch.autocast("cuda"):
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y, reduction="sum")
""", at=((6, 12, '`torch.nn.functional.binary_cross_entropy` reaches `aten'),)),
        Invalid("""
import torch
from torch import nn
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = nn.BCELoss()(model(x).sigmoid(), y)
""", fixed="""
import torch
from torch import nn
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = nn.BCEWithLogitsLoss()(model(x), y)
""", at=((5, 12, '`torch.nn.BCELoss` reaches `aten'),)),
        Invalid("""
import torch
from torch import nn
class Trainer:
    def __init__(self, model):
        self.model = model
        self.criterion = nn.BCELoss()

    def step(self, x, y):
        with torch.autocast("cuda"):
            probs = torch.sigmoid(self.model(x))
            return self.criterion(probs, y)
""", at=((12, 20, '`torch.nn.BCELoss` reaches `aten'),)),
    )

    def check(self, ctx: FileContext) -> None:
        constructions: dict[str, set[str]] | None = None
        project = None  # the project's autocast calls, read at the first loss outside a region

        def spelling_of(call: cst.Call, banned: frozenset[str]) -> str | None:
            nonlocal constructions
            direct = isinstance(call.func, (cst.Name, cst.Attribute))
            spelling = ctx.resolves_to(call.func, banned) if direct else None
            if spelling is not None and _is_module_class(spelling):
                return None  # building the loss module runs nothing; calling it does
            if spelling is None and isinstance(call.func, cst.Call):  # nn.BCELoss()(...)
                spelling = ctx.resolves_to(call.func.func, banned)
            if spelling is None:
                if constructions is None:
                    constructions = _constructions(ctx)
                spelling = next(iter(constructions.get(ctx.code(call.func), set()) & banned), None)
            return spelling

        for call in calls(ctx):
            region = autocast_region(ctx, call)
            if region is None:
                if _disabled_region(ctx, call) or (place := _loss_place(ctx, call)) is None:
                    continue
                handed = _class_handed_over(ctx, call, _banned_anywhere()) \
                    if spelling_of(call, _banned_anywhere()) is None else None
                if handed is not None:
                    self._report_handed_over(ctx, call, handed, place)
                    continue
                if spelling_of(call, _banned_anywhere()) is None:
                    continue
                if project is None:
                    project = ctx.project() or ()
                found = _enabling_site(ctx, project, call, spelling_of)
                if found is not None and _used(ctx, call):
                    table, spelling, where, related = found
                    ops = [op for op in table.ops_reached_by(spelling) if table.policy(op) == "banned"]
                    ctx.report(call, f"`{spelling}` reaches `{ops[0]}`, which autocast refuses on {table.device} "
                                     f"(it raises), and this project runs code under autocast ({where}): if "
                                     f"{place} runs there, it fails; use the `_with_logits` form or compute it "
                                     "in float32 under `autocast(enabled=False)`", self._fix(ctx, call),
                               related=(related,))
                continue
            table = region_table(ctx, region[0])
            if table is None:
                continue
            spelling = spelling_of(call, table.spellings_with("banned"))
            if spelling is None:
                continue
            ops = [op for op in table.ops_reached_by(spelling) if table.policy(op) == "banned"]
            if ops[0].startswith("aten::"):
                advice = "compute it outside the region or use the `_with_logits` form"
            else:  # a project's own op, banned by its autocast registration
                advice = "compute it outside the region, or under `autocast(enabled=False)` in float32"
            ctx.report(call, f"`{spelling}` reaches `{ops[0]}`, which autocast refuses on "
                             f"{table.device} (it raises): {advice}", self._fix(ctx, call))

    def _report_handed_over(self, ctx: FileContext, call: cst.Call, handed, place: str) -> None:
        """A banned loss class handed to ``call``, which builds it, where a loss is computed in
        a project whose other code enables autocast on a device that bans it."""
        reference, spelling = handed
        project = ctx.project() or ()
        if not project or not _used(ctx, call):
            return
        for site in project[1]:
            try:
                table = ctx.policy(site.device)
            except PolicyError:
                continue
            if spelling not in table.spellings_with("banned"):
                continue
            ops = [op for op in table.ops_reached_by(spelling) if table.policy(op) == "banned"]
            more = len(project[1]) - 1
            where = site.where(project[0]) + (f" and {more} more" if more else "")
            related = Related(site.shown_path(), site.row, f"autocast on ({site.setting})" if site.setting
                              else "autocast entered here")
            ctx.report(reference, f"`{spelling}` handed to `{ctx.code(call.func)}`, which builds it: it reaches "
                                  f"`{ops[0]}`, which autocast refuses on {table.device} (it raises), and this "
                                  f"project runs code under autocast ({where}): if {place} runs there, it fails; "
                                  "use the `_with_logits` form or compute it in float32 under "
                                  "`autocast(enabled=False)`", related=(related,))
            return

    def _fix(self, ctx: FileContext, call: cst.Call) -> Fix | None:
        func = call.func.func if isinstance(call.func, cst.Call) else call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _WITH_LOGITS or not call.args:
            return None
        first = call.args[0]
        inner = _sigmoid_input(ctx, first.value) if first.keyword is None else None
        if inner is None:
            return None
        new_func = func.with_changes(attr=cst.Name(_WITH_LOGITS[func.attr.value]))
        new_callee = call.func.with_changes(func=new_func) if isinstance(call.func, cst.Call) else new_func
        new = call.with_changes(func=new_callee, args=[first.with_changes(value=inner), *call.args[1:]])
        return Fix(f"Use `{_WITH_LOGITS[func.attr.value]}` on the logits",
                   (ctx.replace(call, ctx.module.code_for_node(new)),))
