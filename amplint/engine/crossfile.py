"""What a rule reads of the rest of the project (``project_index``) for code in this file that
another file runs: where a loss is computed, and the autocast calls or framework settings of
the project under which it may run. Shared by the rules that report such code (AMP003,
AMP008, AMP018), so that they agree on what counts."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .diagnostics import Related
from .outline import dotted
from .project_index import (AutocastSite, function_dependency, module_dependency, module_text, project_name,
                            relative_name)
from .project_index import project_function as lookup

if TYPE_CHECKING:
    from .ast_context import AstContext
    from .checked_file import CheckedFile

# The methods a training framework runs under the autocast its precision setting opens
# (Lightning's LightningModule hooks).
STEP_HOOKS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


def loss_place(ctx: AstContext, node: ast.AST) -> str | None:
    """Where a loss is computed, if ``node`` is in one: a module's ``forward``
    or step hook, a function or method named like a loss (``compute_loss``,
    ``balance_bce_loss``), or any method of a class named like one (``GAILLoss``). How the code
    there is reached is not followed."""
    function = ctx.enclosing_function(node)
    cls = ctx.enclosing(function, ast.ClassDef) if function is not None else None
    name, cls_name = (function.name if function else None), (cls.name if cls else None)
    if name is None:
        return None
    if "loss" in name.lower() or (cls_name is not None and (name == "forward" or name in STEP_HOOKS)):
        return f"`{cls_name + '.' if cls_name is not None else ''}{name}`"
    if cls_name is not None and "loss" in cls_name.lower():
        return f"`{cls_name}.{name}`"
    return None


def named_loss_place(ctx: AstContext, node: ast.AST) -> str | None:
    """``loss_place``, where the loss is one by its name or its module's
    (``losses/distillation.py``): a module's ``forward`` elsewhere may well run on raw
    float32 data (a feature extractor's spectrum) or end in an op autocast runs in float32."""
    place = loss_place(ctx, node)
    if place is None or ("loss" not in place.lower()
                         and not any("loss" in part.lower() for part in Path(ctx.path).parts[-2:])):
        return None
    return place


def may_run(ctx: "CheckedFile", site: AutocastSite, names: Iterable[str]) -> bool:
    """Whether code named ``names`` (the class or function a loss is in) may run under
    ``site``: any code, where the site's framework trains what it is given; where it trains one
    class of the project (``AutocastSite.trains``), that class, or code its module or the
    site's module names. The file's findings then depend on those modules' text."""
    if site.trains is None:
        return True
    wanted = set(names)
    trained, defined_in = site.trains
    if trained in wanted:
        return True
    root = ctx.project_root()
    for path in dict.fromkeys((site.path, defined_in)):
        if root is not None:
            ctx.dependencies.add(module_dependency(root, path))
        text = module_text(path) or ""
        if any(re.search(rf"\b{re.escape(name)}\b", text) for name in wanted):
            return True
    return False


def project_function(ctx: AstContext, call: ast.Call) -> tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef] | None:
    """The module-level function of another file of the project that ``call`` runs, by the
    name the file imports it under (``training_util.enable_clipping`` for ``from pkg.training
    import util as training_util``), with that file; None for a call of anything else. The
    file's findings then depend on that function's code."""
    root = ctx.project_root()
    if root is None:
        return None
    for module, level, name in imported_in(ctx, call.func):
        found = lookup(root, Path(ctx.path), module, level, name)
        if found is None:
            continue
        path, function = found
        ctx.dependencies.add(function_dependency(root, path, name))
        if function is not None and path.resolve() != Path(ctx.path).resolve():
            return path, function
    return None


def imported_in(ctx: AstContext, func: ast.expr) -> list[tuple[str | None, int, str]]:
    """``imported_as`` by the names the file's outline resolves."""
    return imported_as(func, ctx.outline.qualified_names(func), sorted(ctx.outline.nodes(ast.ImportFrom), key=ctx.order))


def imported_as(func: ast.expr, qualified: Iterable[str], imports: Iterable[ast.ImportFrom]
                ) -> list[tuple[str | None, int, str]]:
    """Where ``func`` may be imported from, as (module, level of its relative import, name):
    by the module's absolute imports (``qualified``, what ``func`` stands for through them),
    else by its relative ones among ``imports`` (``from .utils import helper``: ``helper``;
    ``from . import utils``: ``utils.helper``)."""
    found = [(q.rpartition(".")[0], 0, q.rpartition(".")[2]) for q in sorted(qualified) if "." in q]
    parts = dotted(func)
    if found or parts is None or len(parts) > 2:
        return found
    for stmt in imports:
        if not stmt.level or stmt.names[0].name == "*":
            continue
        for alias in stmt.names:
            local = alias.asname or alias.name
            if parts == [local]:
                found.append((stmt.module, stmt.level, alias.name))
            elif len(parts) == 2 and parts[0] == local:
                found.append((f"{stmt.module}.{alias.name}" if stmt.module else alias.name, stmt.level, parts[1]))
    return found


def located(ctx: CheckedFile, path: Path, row: int, message: str) -> tuple[str, Related]:
    """How a finding names a line of another file of the project: ``pkg/utils.py:12`` (from
    the project's root) in its message, and as a related location (``message`` says what is
    there)."""

    root = ctx.project_root()
    where = project_name(path.resolve(), root.resolve()) if root is not None else path.as_posix()
    return f"{where}:{row}", Related(relative_name(path.resolve(), Path.cwd()), row, message)
