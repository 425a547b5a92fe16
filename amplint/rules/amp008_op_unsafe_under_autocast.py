from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from ..engine.ast_context import AstContext
from ..engine.crossfile import loss_place, may_run
from ..engine.enabling import site_named, site_related
from ..engine.diagnostics import Fix, Related
from ..engine.reach import used
from ..engine.region_tables import region_table
from ..engine.regions import autocast_of_with_item, autocast_region
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..policy import PolicyError, PolicyTable, committed_tables, user_tables

_SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})
_WITH_LOGITS = {"binary_cross_entropy": "binary_cross_entropy_with_logits",
                "BCELoss": "BCEWithLogitsLoss"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# What bounds a region: the nodes ``regions.autocast_region`` stops at.
_REGION_BOUNDS = (ast.With, ast.AsyncWith, *_FUNCTIONS, ast.Lambda)


def _constructions(ctx: AstContext, banned: frozenset[str]) -> dict[str, set[str]]:
    """``name = torch.nn.SomeLoss(...)`` anywhere: for each target built from a spelling in
    ``banned``, those spellings."""
    built: dict[str, set[str]] = {}
    for node in ctx.outline.nodes(ast.Assign):
        if isinstance(node.value, ast.Call):
            names = {n for n in ctx.outline.qualified_names(node.value.func) if n.startswith("torch.")} & banned
            for target in node.targets if names else ():
                built.setdefault(ctx.code(target), set()).update(names)
    return built


def _is_module_class(spelling: str) -> bool:
    return spelling.rsplit(".", 1)[-1][:1].isupper()


def _sigmoid_input(ctx: AstContext, expr: ast.expr) -> ast.expr | None:
    """``z`` for ``torch.sigmoid(z)``, ``F.sigmoid(z)`` or ``z.sigmoid()``."""
    if not isinstance(expr, ast.Call):
        return None
    if ctx.resolves_to(expr.func, _SIGMOID) and len(expr.args) == 1 and not expr.keywords \
            and not isinstance(expr.args[0], ast.Starred):
        return expr.args[0]
    if isinstance(expr.func, ast.Attribute) and expr.func.attr == "sigmoid" and not expr.args and not expr.keywords:
        return expr.func.value
    return None


@lru_cache(maxsize=None)
def _banned_anywhere() -> frozenset[str]:
    """The spellings some committed table bans (read when first asked: not at start-up)."""
    return frozenset(spelling for table in committed_tables() for spelling in table.spellings_with("banned"))


def _banned_here(ctx: AstContext) -> frozenset[str]:
    """The spellings that any table this file is judged with may ban: those some committed
    table bans, and those a project's own tables (``[tool.amplint] policies``) ban, which
    are merged over the committed ones."""
    folder = getattr(ctx.policy_loader, "policies", None)
    if folder is None:
        return _banned_anywhere()
    return _banned_anywhere().union(*(PolicyTable(table).spellings_with("banned")
                                      for _, table in user_tables(folder).values()))


def _disabled_region(ctx: AstContext, node: ast.AST) -> bool:
    """Inside ``with autocast(enabled=False)``: what the region around it runs is out of autocast."""
    ancestor = ctx.enclosing(node, _REGION_BOUNDS)
    while ancestor is not None:
        if isinstance(ancestor, (ast.With, ast.AsyncWith)):
            if any((ac := autocast_of_with_item(ctx, item)) is not None and ac.enabled is False
                   for item in ancestor.items):
                return True
        else:  # a function or lambda
            return False
        ancestor = ctx.enclosing(ancestor, _REGION_BOUNDS)
    return False


def _used(ctx: AstContext, node: ast.AST) -> bool:
    """Whether the project uses the class or function at the top of this file that ``node`` is
    in (``reach.used``): code nothing uses never runs under another file's autocast."""
    root = ctx.project_root()
    outermost = None
    ancestor = ctx.parent(node)
    while ancestor is not None:
        if isinstance(ancestor, (ast.ClassDef, *_FUNCTIONS)):
            outermost = ancestor
        ancestor = ctx.parent(ancestor)
    if root is None or outermost is None:
        return True
    read: set = set()
    answer = used(root, Path(ctx.path), outermost.name, read)
    ctx.dependencies.update(read)
    return answer


def _class_handed_over(ctx: AstContext, call: ast.Call, banned: frozenset[str]):
    """``(reference, spelling)`` for a banned loss class handed to a call uncalled, for that
    call to build it (``BaseLoss(nn.BCELoss, *args, **kwargs)``, ``partial(nn.BCELoss, ...)``);
    not a test of a type (``isinstance(m, nn.BCELoss)``)."""
    if isinstance(call.func, ast.Name) and call.func.id in ("isinstance", "issubclass", "type"):
        return None
    # in source order: no plain positional argument follows a keyword
    for value in (*call.args, *(k.value for k in call.keywords if k.arg is not None)):
        if not isinstance(value, (ast.Name, ast.Attribute)):
            continue
        spelling = ctx.resolves_to(value, banned)
        if spelling is not None and _is_module_class(spelling):
            return value, spelling
    return None


def _sites_running(ctx: AstContext, project, node: ast.AST) -> list:
    """The project's autocast sites under which the code around ``node`` may run
    (``crossfile.may_run``), by the name of the outermost class around it, else of the
    outermost function: a method's own name (`forward`, `training_step`) names no one thing."""
    if not project:
        return []
    outer = None
    scope = ctx.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    while scope is not None:
        if isinstance(scope, ast.ClassDef) or not isinstance(outer, ast.ClassDef):
            outer = scope
        scope = ctx.enclosing(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    names = {outer.name} if outer is not None else set()
    return [site for site in project[1] if may_run(ctx, site, names)]


def _enabling_site(ctx: AstContext, project, call: ast.Call, spelling_of):
    """(table, spelling, where, related) for the first autocast call of the project whose device's
    table bans what ``call`` reaches; a device that is not a literal is judged with the
    configured device's table."""
    sites = _sites_running(ctx, project, call)
    if not sites:
        return None
    for site in sites:
        try:
            table = ctx.policy(site.device)
        except PolicyError:  # a device the tables do not cover
            continue
        spelling = spelling_of(call, table.spellings_with("banned"))
        if spelling is not None:
            return table, spelling, site_named(ctx, site, len(sites) - 1), site_related(site)
    return None


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
    table. A setting whose code fits one model it builds right there from nothing its caller
    passes (`model = Finetuner()`, then `trainer.fit(model)`) counts only for that class, and
    for the code its module or the setting's module names (a loss class `Finetuner` uses): a
    loss of another model is not shown to run there. The loss must be in code the project uses
    (`reach`): its class or function (the outermost one around it) is decorated (a registry), named in a config file, in module-level
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
        # The fix edits the call's text: its other lines, comments and indentation stay.
        Invalid("""
import torch
import torch.nn.functional as F
class MaskLoss:
    def forward(self, logits, y):
        with torch.autocast("cuda"):
            return F.binary_cross_entropy(
                torch.sigmoid(logits),  # probabilities
                y,
                reduction="none")
""", fixed="""
import torch
import torch.nn.functional as F
class MaskLoss:
    def forward(self, logits, y):
        with torch.autocast("cuda"):
            return F.binary_cross_entropy_with_logits(
                logits,  # probabilities
                y,
                reduction="none")
""", at=((7, 20, '`torch.nn.functional.binary_cross_entropy` reaches `aten'),)),
    )

    def check(self, ctx: AstContext) -> None:
        banned_anywhere = _banned_anywhere()
        banned = _banned_here(ctx)
        constructions = _constructions(ctx, banned)
        qualified_names = ctx.outline.qualified_names

        def may_reach(call: ast.Call) -> bool:
            """Whether ``call`` may run a spelling in ``banned`` (``spelling_of``) or be handed
            a banned class (``_class_handed_over``)."""
            func = call.func
            return not qualified_names(func).isdisjoint(banned) \
                or (isinstance(func, ast.Call) and not qualified_names(func.func).isdisjoint(banned)) \
                or (bool(constructions) and ctx.code(func) in constructions) \
                or any(not qualified_names(value).isdisjoint(banned_anywhere)
                       for value in (*call.args, *(k.value for k in call.keywords)))

        project = None  # the project's autocast calls, read at the first loss outside a region

        def spelling_of(call: ast.Call, banned: frozenset[str]) -> str | None:
            direct = isinstance(call.func, (ast.Name, ast.Attribute))
            spelling = ctx.resolves_to(call.func, banned) if direct else None
            if spelling is not None and _is_module_class(spelling):
                return None  # building the loss module runs nothing; calling it does
            if spelling is None and isinstance(call.func, ast.Call):  # nn.BCELoss()(...)
                spelling = ctx.resolves_to(call.func.func, banned)
            if spelling is None:
                spelling = next(iter(constructions.get(ctx.code(call.func), set()) & banned), None)
            return spelling

        for call in sorted(filter(may_reach, ctx.outline.nodes(ast.Call)), key=ctx.order):
            region = autocast_region(ctx, call)
            if region is None:
                if _disabled_region(ctx, call) or (place := loss_place(ctx, call)) is None:
                    continue
                handed = _class_handed_over(ctx, call, banned_anywhere) \
                    if spelling_of(call, banned_anywhere) is None else None
                if handed is not None:
                    self._report_handed_over(ctx, call, handed, place)
                    continue
                if spelling_of(call, banned_anywhere) is None:
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

    def _report_handed_over(self, ctx: AstContext, call: ast.Call, handed, place: str) -> None:
        """A banned loss class handed to ``call``, which builds it, where a loss is computed in
        a project whose other code enables autocast on a device that bans it."""
        reference, spelling = handed
        project = ctx.project() or ()
        if not project or not _used(ctx, call):
            return
        sites = _sites_running(ctx, project, call)
        for site in sites:
            try:
                table = ctx.policy(site.device)
            except PolicyError:
                continue
            if spelling not in table.spellings_with("banned"):
                continue
            ops = [op for op in table.ops_reached_by(spelling) if table.policy(op) == "banned"]
            more = len(sites) - 1
            where = site.where(project[0]) + (f" and {more} more" if more else "")
            related = Related(site.shown_path(), site.row, f"autocast on ({site.setting})" if site.setting
                              else "autocast entered here")
            ctx.report(reference, f"`{spelling}` handed to `{ctx.code(call.func)}`, which builds it: it reaches "
                                  f"`{ops[0]}`, which autocast refuses on {table.device} (it raises), and this "
                                  f"project runs code under autocast ({where}): if {place} runs there, it fails; "
                                  "use the `_with_logits` form or compute it in float32 under "
                                  "`autocast(enabled=False)`", related=(related,))
            return

    @staticmethod
    def _fix(ctx: AstContext, call: ast.Call) -> Fix | None:
        """The call's text with the `_with_logits` name and the sigmoid's input for its first
        argument; the rest of its text as it is."""
        func = call.func.func if isinstance(call.func, ast.Call) else call.func
        if not isinstance(func, ast.Attribute) or func.attr not in _WITH_LOGITS or not call.args:
            return None
        first = call.args[0]
        inner = _sigmoid_input(ctx, first)
        if inner is None:
            return None
        name = _WITH_LOGITS[func.attr]
        (start, end), func_end, (first_start, first_end) = ctx.offsets(call), ctx.offsets(func)[1], ctx.offsets(first)
        text = (ctx.source[start:func_end - len(func.attr)] + name + ctx.source[func_end:first_start]
                + ctx.code(inner) + ctx.source[first_end:end])
        return Fix(f"Use `{name}` on the logits", (ctx.replace(call, text),))
