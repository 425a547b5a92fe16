from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst

from ..engine.checkpoints import (RESTORE_WORDS, SCALER_CLASSES, SCALER_PARAMS, Scaler, checkpoints, holds, key_text,
                                  last_name, name_words, named_like_scaler, optimizer_restores,
                                  restores_from_checkpoint, scaler_creations, scalers, spelled, subexpressions, words)
from ..engine.context import FileContext
from ..engine.crossfile import located
from ..engine.diagnostics import Related
from ..engine.outline import Outline, contains
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.semantics import enclosing_function, named_like_optimizer, statement_of
from ..engine.summaries import callee_summary

_CHECKPOINT_WORDS = frozenset({"save", "checkpoint", "ckpt"})


def _unit(ctx: FileContext, node: cst.CSTNode) -> cst.CSTNode:
    """The class a node is in (its methods share their scalers and checkpoints), else the module."""
    return ctx.enclosing(node, cst.ClassDef) or ctx.module


def _self_call(call: cst.Call) -> bool:
    """``self.method(...)``."""
    return isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) \
        and call.func.value.value == "self"


def _names_scaler(subscript: cst.Subscript) -> bool:
    """``ckpt["scaler"]``, ``state["grad_scaler_state"]``."""
    return any(isinstance(e.slice, cst.Index) and "scaler" in (key_text(e.slice.value) or "") for e in subscript.slice)


def _line(ctx: FileContext, node: cst.CSTNode) -> int:
    return ctx.location(ctx.offsets(node)[0]).row


def _may_be_optimizer(expr: ast.expr) -> bool:
    """Named like an optimizer (``self.opt_g``), or an expression ``named_like_optimizer`` reads
    from its text (``self.optimizers[0]``)."""
    if isinstance(expr, ast.Attribute):
        return named_like_optimizer(expr.attr)
    return named_like_optimizer(expr.id) if isinstance(expr, ast.Name) else True


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _named_like_scaler(expr: ast.expr) -> bool:
    return isinstance(expr, (ast.Name, ast.Attribute)) and named_like_scaler(_name(expr))


def _plain_string(node: ast.AST | None, word: str) -> bool:
    """A string literal holding ``word`` (lowercased), written with no prefix, escape or second
    part: its width in the source is its value's, quotes aside, so libcst's raw text of it
    (``key_text``) holds the word too."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and word in node.value.lower() \
        and node.end_lineno == node.lineno and node.end_col_offset - node.col_offset == len(node.value.encode()) + 2


def _branches(value: ast.expr) -> list[ast.expr]:
    """The values an assignment may bind: both sides of ``a if c else b`` and of ``x or y``
    (``creates_scaler``)."""
    if isinstance(value, ast.IfExp):
        return _branches(value.body) + _branches(value.orelse)
    if isinstance(value, ast.BoolOp):
        return [b for v in value.values for b in _branches(v)]
    return [value]


# What an attribute that names a GradScaler class ends with (``torch.amp.GradScaler``).
_CLASS_NAMES = frozenset(q.rpartition(".")[2] for q in SCALER_CLASSES)


def _scaler_creations(outline: Outline) -> list[ast.Assign | ast.AnnAssign]:
    """``scaler_creations``, loosely: assignments of a call of a GradScaler class, or of a name
    the file assigns anything that names one (``GradScaler = torch.cuda.amp.GradScaler``,
    ``functools.partial(torch.GradScaler, ...)``)."""
    imports = [*outline.nodes(ast.Import), *outline.nodes(ast.ImportFrom)]
    if any(a.name == "*" for i in imports for a in i.names):
        names = outline.nodes(ast.Name)  # a star import may bind any of them
    else:  # only a name an import binds stands for a class of another module
        bound = {a.asname or a.name.split(".")[0] for i in imports for a in i.names}
        names = [n for n in outline.nodes(ast.Name) if n.id in bound]
    named = [n for n in [*names, *(a for a in outline.nodes(ast.Attribute) if a.attr in _CLASS_NAMES)]
             if not outline.qualified_names(n).isdisjoint(SCALER_CLASSES)]
    if not named:  # neither a GradScaler class called nor an alias of one
        return []
    aliases = {t.id for a in outline.nodes(ast.Assign) if any(contains(a.value, n) for n in named)
               for t in a.targets if isinstance(t, ast.Name)}
    return [a for a in (*outline.nodes(ast.Assign), *outline.nodes(ast.AnnAssign)) if a.value is not None and any(
        isinstance(v, ast.Call) and (not outline.qualified_names(v.func).isdisjoint(SCALER_CLASSES)
                                     or isinstance(v.func, ast.Name) and v.func.id in aliases)
        for v in _branches(a.value))]


def _spells(expr: ast.expr, word: str) -> bool:
    """Whether ``word`` is in a name, attribute or string of ``expr`` (in its text, as the
    check reads an annotation, without rendering it)."""
    return any(isinstance(n, ast.Name) and word in n.id or isinstance(n, ast.Attribute) and word in n.attr
               or isinstance(n, ast.Constant) and isinstance(n.value, str) and word in n.value
               for n in ast.walk(expr))


def _class_of(outline: Outline, node: ast.AST) -> ast.ClassDef | None:
    """``_unit`` on the ast: the innermost class around ``node`` (they nest: the one that starts
    last); None for the module."""
    return max((c for c in outline.nodes(ast.ClassDef) if contains(c, node)),
               key=lambda c: (c.lineno, c.col_offset), default=None)


def _scaler_units(outline: Outline, creations: list) -> set[ast.ClassDef | None]:
    """The classes (None: the module) where ``scalers`` may find a GradScaler: created,
    received (a parameter named like one, or annotated with a GradScaler class), or scaling a
    backward (``S.scale(loss).backward()``)."""
    places = [*creations,
              *(a for a in outline.nodes(ast.arg) if a.arg in SCALER_PARAMS
                or a.annotation is not None and _spells(a.annotation, "GradScaler")),
              *(c for c in outline.method_calls("backward") if isinstance(c.func.value, ast.Call)
                and isinstance(c.func.value.func, ast.Attribute) and c.func.value.func.attr == "scale")]
    return {_class_of(outline, p) for p in places}


def _state_call(call: ast.Call) -> bool:
    name = _name(call.func).lower()
    return "state_dict" in name and not name.startswith(("load", "set"))


def _may_checkpoint(outline: Outline) -> bool:
    """What a checkpoint (``checkpoints``) needs: some state read (``x.state_dict()``), and an
    optimizer's state read (``optimizer.state_dict()``, ``get_optimizer_state_dict(...)``) or
    a dict key, subscript or keyword naming an optimizer."""
    states = [c for c in outline.nodes(ast.Call) if _state_call(c)]
    if not states:
        return False
    if any(_name(c.func) == "state_dict" and isinstance(c.func, ast.Attribute) and _may_be_optimizer(c.func.value)
           or _name(c.func) != "state_dict" and "optim" in _name(c.func).lower() for c in states):
        return True
    if any(k.arg and "optim" in k.arg.lower() for c in outline.nodes(ast.Call) for k in c.keywords):
        return True
    keys = [*(k for d in outline.nodes(ast.Dict) for k in d.keys), *(s.slice for s in outline.nodes(ast.Subscript))]
    return any(isinstance(k, ast.Constant) and isinstance(k.value, str) and "optim" in k.value.lower() for k in keys)


def _calls_imported(outline: Outline) -> bool:
    """A call of a name another module binds (``save_checkpoint(...)`` after ``from .utils
    import save_checkpoint``, ``utils.save(...)``): a checkpoint another module may write."""
    imported = {a.asname or a.name.split(".")[0] for kind in (ast.Import, ast.ImportFrom)
                for node in outline.nodes(kind) for a in node.names
                if (getattr(node, "module", None) or a.name).split(".")[0] != "torch"}  # torch's own run no helper
    return any(isinstance(c.func, ast.Name) and c.func.id in imported
               or isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.value.id in imported
               for c in outline.nodes(ast.Call))


def _may_restore_optimizer(outline: Outline) -> bool:
    """What ``optimizer_restores`` needs: ``optimizer.load_state_dict(...)``, or a call named like
    loading or setting an optimizer's state dict (``set_optimizer_state_dict(...)``), given
    arguments."""
    for call in outline.nodes(ast.Call):
        name = _name(call.func).lower()
        if (call.args or call.keywords) and "state_dict" in name and name.startswith(("load", "set")) and (
                name == "load_state_dict" and isinstance(call.func, ast.Attribute) and _may_be_optimizer(call.func.value)
                or name != "load_state_dict" and "optim" in name):
            return True
    return False


def _surely_saving(outline: Outline) -> set[ast.ClassDef | None]:
    """The classes (None: the module) that ``_saves_scaler`` surely finds saving a scaler's
    state, by some of its tests: a ``state_dict()`` of something named like a scaler, a dict key
    or an assigned subscript naming one (``"scaler"``)."""
    found = [c for c in outline.method_calls("state_dict") if _named_like_scaler(c.func.value)]
    found += [d for d in outline.nodes(ast.Dict) if any(_plain_string(k, "scaler") for k in d.keys)]
    found += [a for a in outline.nodes(ast.Assign)
              if isinstance(a.targets[0], ast.Subscript) and _plain_string(a.targets[0].slice, "scaler")]
    return {_class_of(outline, n) for n in found}


def _surely_restoring(outline: Outline) -> set[ast.ClassDef | None]:
    """The classes (None: the module) that ``_restores_scaler`` surely finds restoring a
    scaler's state, by some of its tests: a ``load_state_dict`` of something named like a
    scaler, a subscript naming one read (``ckpt["scaler"]``)."""
    found = [c for c in outline.method_calls("load_state_dict") if _named_like_scaler(c.func.value)]
    found += [s for s in outline.nodes(ast.Subscript) if isinstance(s.ctx, ast.Load) and _plain_string(s.slice, "scaler")]
    return {_class_of(outline, n) for n in found}


def _restore_call(call: ast.Call) -> bool:
    """``x.load_state_dict(...)``, or a call named like a load or restore (``restores_from_checkpoint``)."""
    return _name(call.func) == "load_state_dict" and isinstance(call.func, ast.Attribute) \
        or not words(_name(call.func)).isdisjoint(RESTORE_WORDS)


_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.ExceptHandler, ast.Match,
           ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _may_replace_restored(outline: Outline, creations: list) -> bool:
    """What ``_replaced_after_restore`` needs, loosely: a GradScaler created in a function after
    a restore call in the same block (here: the innermost compound statement around it); or
    directly in the body of a method of a class with a restore call and another method, its
    ``__init__``."""
    creations = [c for c in creations if outline.scopes[id(c)] != 0]  # in a function
    restores = [c for c in outline.nodes(ast.Call) if _restore_call(c)] if creations else []
    if not restores:
        return False
    blocks = [n for kind in _BLOCKS for n in outline.nodes(kind)]
    for creation in creations:
        block = max((b for b in blocks if contains(b, creation)), key=lambda b: (b.lineno, b.col_offset))
        start = (creation.lineno, creation.col_offset)
        if any(contains(block, r) and (r.lineno, r.col_offset) < start for r in restores):
            return True
        cls = next((c for c in outline.nodes(ast.ClassDef) if block in c.body), None) \
            if isinstance(block, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if cls is not None and any(contains(cls, r) for r in restores):
            init = next((m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and m.name == "__init__"), None)  # the first, as the check finds it
            if init is not None and init is not block:
                return True
    return False


def _may_fire(outline: Outline) -> bool:
    """Where ``scalers`` may find a GradScaler (``_scaler_units``): a checkpoint
    (``_may_checkpoint``) while a class or module with a scaler does not surely save one; an
    optimizer restored (``_may_restore_optimizer``) while one does not surely restore one; or
    a scaler that may replace a restored one (``_may_replace_restored``)."""
    creations = _scaler_creations(outline)
    units = _scaler_units(outline, creations)
    if not units:
        return False
    return ((_may_checkpoint(outline) or _calls_imported(outline)) and bool(units - _surely_saving(outline))
            or _may_restore_optimizer(outline) and bool(units - _surely_restoring(outline))
            or _may_replace_restored(outline, creations))


class ScalerStateNotCheckpointed(Rule):
    """
    ## What it does
    Where a file uses a GradScaler, finds training checkpoints (state that holds an
    optimizer's state) that do not save the scaler's state, resumes that restore an optimizer
    but not the scaler, and a new GradScaler created after a checkpoint restored the old one.

    A checkpoint is a dict (a literal, `dict(...)`, a constructor's keyword arguments such as
    `Snapshot(optimizer_state=...)`, or `ckpt["optimizer"] = ...`) with an optimizer's state
    in it, or an optimizer's state saved as a file of its own (`torch.save(optimizer.state_dict(),
    "optimizer.pt")`). It is reported once, where it is built, naming the scaler and, when the
    resume forgets the scaler too, the line of that resume.

    A checkpoint may be written by a function of another module of the project
    (`utils.save_checkpoint(model, optimizer, epoch, path)`), or a function that one calls,
    followed up to three calls deep (`summaries`): a `torch.save(...)` of state that names an
    optimizer's and no scaler's. Where a scaler is in use and the call passes neither the
    scaler nor an object that holds it (`self`), the finding sits on the call and names the
    helper's `torch.save` (also a related location). It is not made when the helper's saved
    state takes parts from its caller (`**extra`, a dict parameter), or when the project
    takes a scaler's state to save it anywhere (`scaler.state_dict()`, a `"scaler"` key).

    ## Why is this bad?
    The scaler's state (the current loss scale and its growth tracker) is part of the
    training state. A run resumed without it restarts at a scale of 65536: the first steps
    overflow and are skipped, or, after a long run at a small scale, gradients underflow.
    PyTorch's AMP examples save and load it with the model and optimizer.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    ```

    ## Fix
    ```python
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)
    ```
    and `scaler.load_state_dict(checkpoint["scaler"])` where the optimizer is restored. Create
    the scaler before the checkpoint is restored, and do not replace it afterwards.

    ## Fix safety
    No automatic fix: the key name and the loading side are the author's.

    ## False positives
    A file uses a GradScaler where it assigns one (`torch.amp.GradScaler(...)`,
    `torch.cuda.amp.GradScaler`, `ShardedGradScaler`, a module-level alias of one), receives one
    (a parameter named `scaler`, `grad_scaler` or `amp_scaler`, or annotated with a GradScaler
    class), or scales a loss with one (`S.scale(loss).backward()`). Scalers and checkpoints are
    matched within a class, or, outside classes, within the module (a scaler in a class does
    not make a module-level function's checkpoint need it): a checkpoint needs a scaler held
    by its function or one around it, by the class (`self.scaler`) or the module, or local to
    a function of the same class or module that calls the checkpoint's function (directly or
    through others: `self.save_model(...)`). State built only to be loaded back (an old
    checkpoint converted, then handed to a `load...` call) is no checkpoint.
    The scaler's state counts as saved anywhere in that class or module if some scaler's
    `state_dict()` is taken (an attribute named like a scaler, or the object that holds it:
    `self.state.state_dict()` for `self.state.scaler`), a dict key or subscript names a scaler
    (`"grad_scaler_state"`), or the scaler (or its holder) is passed to a call named like a
    save or a checkpoint. It counts as restored if some scaler's `load_state_dict` is called,
    a checkpoint entry naming a scaler is read, or the scaler (or its holder) is passed to or
    assigned from a call named like a load, a restore or a resume.
    A replacement is reported when it follows a restore of the same scaler in the same block
    (or one around it), or when a method other than `__init__` assigns a new scaler, outside
    any condition, to what `__init__` (or a method it calls) restored from a checkpoint; one
    under a condition (a new precision asked for) is taken as deliberate, and one in a method
    that `__init__` calls is left alone (it may run before the restore).
    """

    code = "AMP015"
    name = "scaler-state-not-checkpointed"
    summary = "Checkpoint saved or loaded without the GradScaler's state"
    # a scaler, and a checkpoint here or a function of another module that may write one
    fragments = ((AnyOf("scaler", "Scaler", r"\.scale\("),
                  AnyOf("state_dict", "save", "load", "restore", "resume", "import")),)
    may_fire = staticmethod(_may_fire)

    valid = (
        Valid("""
import torch
from checkpointing import save_checkpoint
def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    save_checkpoint(model, optimizer, path, scaler)
""", project=(("checkpointing.py", """
import torch
def save_checkpoint(model, optimizer, path, scaler):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)
"""),)),
        Valid("""
import torch
def save(model, optimizer, scaler, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)

def load(model, optimizer, scaler, path):
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
"""),
        # No scaler in the file.
        Valid("""
import torch
def save(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""),
        # Restored in a helper method.
        Valid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    def resume(self, ckpt):
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self._restore_amp(ckpt)

    def _restore_amp(self, ckpt):
        self.scaler.load_state_dict(ckpt["scaler"])
"""),
        # Model weights alone are not a training checkpoint; the scaler belongs to another class.
        Valid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    def export(self, path):
        torch.save({"model": self.model.state_dict()}, path)

def save(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""),
        # Saved under another key, built up entry by entry, in a conditional expression.
        Valid("""
import torch
def save(model, optimizer, grad_scaler, path):
    state = {"model": model.state_dict()}
    state["optimizer"] = optimizer.state_dict()
    state["grad_scaler_state"] = grad_scaler.state_dict() if grad_scaler is not None else None
    torch.save(state, path)
"""),
        # The scaler lives in a state object that is saved and loaded whole.
        Valid("""
import torch
class Trainer:
    def __init__(self, path):
        self.state.scaler = torch.amp.GradScaler("cuda")
        load_checkpoint(state=self.state, path=path)

    def save(self, path):
        torch.save({"state": self.state.state_dict(), "optimizer": self.optimizer.state_dict()}, path)
"""),
        # Passed to the helper that saves the checkpoint.
        Valid("""
import torch
def train(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()
    save_checkpoint({"optimizer": optimizer.state_dict()}, scaler=scaler)
"""),
        # Created by a method that `__init__` calls before it restores the checkpoint.
        Valid("""
import torch
class Trainer:
    def __init__(self, path):
        self._setup_amp()
        load_checkpoint(self.scaler, path)

    def _setup_amp(self):
        self.scaler = torch.amp.GradScaler("cuda")
"""),
        # A new scaler only when a new precision is asked for; the restore creates none.
        Valid("""
import torch
class Trainer:
    def __init__(self, path):
        self.scaler = torch.amp.GradScaler("cuda")
        self.restore(path, self.scaler)

    def fit(self, precision=None):
        if precision is not None:
            self.scaler = torch.amp.GradScaler("cuda")
"""),
        # An old checkpoint converted to be loaded back, not saved.
        Valid("""
import torch
def build_optimizer(model, checkpoint):
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.scaler = torch.amp.GradScaler("cuda")
    converted = {}
    converted["optimizer"] = checkpoint["optim"].optimizer.state_dict()
    state = converted
    optimizer.load_state_dict(state)
"""),
        # The checkpoint is written by a loop that trains without the scaler and never calls
        # the function that has one.
        Valid("""
import torch
def train_amp(model, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()

def train_plain(model, optimizer, loader, path):
    for x in loader:
        model(x).mean().backward()
    torch.save({"optimizer": optimizer.state_dict()}, path)
"""),
    )
    invalid = (
        Invalid("""
import torch
from checkpointing import save_checkpoint
def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    save_checkpoint(model, optimizer, path)
""", at=((12, 5, "checkpoint written by `save_checkpoint(...)` (checkpointing.py:4) without the GradScaler's"),),
            project=(("checkpointing.py", """
import torch
def save_checkpoint(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""),)),
        Invalid("""
import torch
def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)
""", at=((9, 13, "`scaler` (line 4) is not saved"),)),
        Invalid("""
import torch
class Trainer:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    def resume(self, path):
        ckpt = torch.load(path)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
""", at=((10, 9, "`self.scaler` (line 5) is not restored"),)),
        # Checkpoint and resume both forget it: one finding, at the checkpoint, naming the resume.
        Invalid("""
import torch
def train(model, optimizer, loader, resume_from=None):
    if resume_from:
        optimizer.load_state_dict(torch.load(resume_from)["optimizer"])
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()

    def save_state(step):
        checkpoint = {
            "optimizer": optimizer.state_dict(),
            "step": step,
        }
        torch.save(checkpoint, f"state_{step}.pt")
    save_state(0)
""", at=((11, 22, "the resume at line 5 does not restore it either"),)),
        # Separate files, in a method of the class whose other method uses the scaler.
        Invalid("""
import torch
class Model:
    def train(self, optimizer, scheduler):
        scaler = torch.amp.GradScaler("cuda")
        scaler.scale(self.loss()).backward()
        self.save_model("out", optimizer, scheduler)

    def save_model(self, output_dir, optimizer, scheduler):
        torch.save(optimizer.state_dict(), output_dir + "/optimizer.pt")
        torch.save(scheduler.state_dict(), output_dir + "/scheduler.pt")
""", at=((10, 9, "`scaler` (line 5) is not saved"),)),
        # Module-level code, a dict() call, helper constructors, a dict filled entry by entry.
        Invalid("""
import torch
scaler = torch.amp.GradScaler("cuda")
torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict()), "last.pt")
snapshot = Snapshot(model_state=model.state_dict(), optimizer_state=optimizer.state_dict())
last = TrainState(model.state_dict(), optimizer.state_dict(), step=10)

def checkpoint(model, opt_g, opt_d):
    ckpt = {}
    ckpt["generator_optimizer"] = opt_g.state_dict()
    ckpt["discriminator_optimizer"] = opt_d.state_dict()
    return ckpt
""", at=((4, 12, "`scaler` (line 3) is not saved"), (5, 12, "checkpoint without the GradScaler's state"),
         (6, 8, "checkpoint without the GradScaler's state"), (10, 5, "checkpoint without the GradScaler's state"))),
        # A checkpoint wrapped in a constructor is still one checkpoint, reported at the dict.
        Invalid("""
import torch
class Trainer:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def get_checkpoint_state(self):
        training_states = {"optimizer": self.optimizer.state_dict(), "epoch": self.epoch}
        return TrainerCheckpoint(self.model.state_dict(), training_states)
""", at=((8, 27, "`self._scaler` (line 5) is not saved"),)),
        # A module-level helper called by the function that has the scaler.
        Invalid("""
import torch
def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        scaler.scale(model(x).mean()).backward()
    save_checkpoint(model, optimizer, path)

def save_checkpoint(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
""", at=((10, 16, "`scaler` (line 4) is not saved"),)),
        # The optimizer restored through a wrapper's method, the scaler never.
        Invalid("""
import torch
def resume(model, optimizer, path, grad_scaler):
    state = torch.load(path)
    model.load_optim_state_dict(optimizer, state["optimizer"])
""", at=((5, 5, "`grad_scaler` (line 3) is not restored"),)),
        # The restored scaler is replaced by a new one.
        Invalid("""
import torch
class Trainer:
    def __init__(self, args):
        self.scaler = torch.amp.GradScaler("cuda")
        if args.restore_path:
            self.model, self.optimizer, self.scaler = self.restore_model(args.restore_path, self.scaler)
            self.scaler = torch.amp.GradScaler("cuda")
""", at=((8, 13, "replaces the scaler restored at line 7"),)),
        # A scaler (re)created after `__init__` restored the state that holds it.
        Invalid("""
import torch
class Trainer:
    def __init__(self, path):
        self.state = State()
        load_checkpoint(state=self.state, path=path)

    def _train_loop(self):
        self.state.scaler = torch.amp.GradScaler("cuda")
        for batch in self.loader:
            self.state.scaler.scale(self.loss(batch)).backward()
""", at=((9, 9, "which `__init__` restored from a checkpoint at line 6"),)),
        # ... or restored through a method `__init__` calls.
        Invalid("""
import torch
class Trainer:
    def __init__(self, path):
        self.scaler = torch.amp.GradScaler("cuda")
        self.load(path)

    def load(self, path):
        ckpt = torch.load(path)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])

    def train(self):
        self.scaler = torch.amp.GradScaler("cuda")
""", at=((14, 9, "restored from a checkpoint at line 11"),)),
    )

    def check(self, ctx: FileContext) -> None:
        by_unit: dict[int, list[Scaler]] = {}
        for scaler in scalers(ctx):
            by_unit.setdefault(id(_unit(ctx, scaler.node)), []).append(scaler)
        if not by_unit:
            return
        self._replaced_after_restore(ctx)
        restores: dict[int, list[cst.Call]] = {}
        for call in optimizer_restores(ctx):
            restores.setdefault(id(_unit(ctx, call)), []).append(call)
        reported_units: set[int] = set()
        for node in checkpoints(ctx):
            unit = _unit(ctx, node)
            visible = self._visible(ctx, node, unit, by_unit.get(id(unit), []))
            if not visible or self._saved(ctx, unit, by_unit[id(unit)]):
                continue
            reported_units.add(id(unit))
            message = (f"checkpoint without the GradScaler's state: `{visible[0].code}` (line "
                       f"{_line(ctx, visible[0].node)}) is not saved, so a resumed run restarts its loss scale")
            unrestored = next((c for c in restores.get(id(unit), ()) if self._visible(ctx, c, unit, visible)), None)
            if unrestored is not None and not self._restored(ctx, unit, by_unit[id(unit)]):
                message += f"; the resume at line {_line(ctx, unrestored)} does not restore it either"
            ctx.report(node, message)
        self._written_by_helpers(ctx, by_unit, reported_units)
        for key, calls in restores.items():
            unit = _unit(ctx, calls[0])
            if key in reported_units or key not in by_unit or self._restored(ctx, unit, by_unit[key]):
                continue
            seen_functions: set[int] = set()
            for call in calls:
                function = id(enclosing_function(ctx, call))
                visible = self._visible(ctx, call, unit, by_unit[key])
                if function in seen_functions or not visible:
                    continue
                seen_functions.add(function)
                ctx.report(call, f"optimizer state restored without the GradScaler's: `{visible[0].code}` (line "
                                 f"{_line(ctx, visible[0].node)}) is not restored, so its loss scale restarts; "
                                 f"call `{visible[0].code}.load_state_dict(...)` here")

    def _written_by_helpers(self, ctx: FileContext, by_unit: dict[int, list[Scaler]], reported: set[int]) -> None:
        """Where a scaler is in use, a call of another module's function that writes a checkpoint
        with an optimizer's state and without the scaler's (``summaries``), when nothing passes
        the scaler to it and the project saves no scaler's state anywhere."""
        for key, unit_scalers in by_unit.items():
            unit = _unit(ctx, unit_scalers[0].node)
            if key in reported or self._saved(ctx, unit, unit_scalers):
                continue
            for call in self._in_unit(ctx, unit, cst.Call):
                # the scaler, or an object that holds it (`self` too: the helper may save its scaler)
                if any(self._is_scaler(ctx, a.value, unit_scalers) or (
                        isinstance(a.value, cst.Name) and a.value.value == "self") for a in call.args):
                    continue
                visible = self._visible(ctx, call, unit, unit_scalers)
                summary = callee_summary(ctx, call) if visible else None
                if summary is None or summary.place.path.resolve() == Path(ctx.path).resolve():
                    continue
                written = next((c.place for c in summary.checkpoints
                                if c.optimizer_state and not c.scaler_state and not c.from_caller), None)
                if written is None or ctx.scaler_states_saved():
                    continue
                where, related = located(ctx, written.path, written.row, f"`{written.code}`, in `{(summary.name, *written.via)[-1]}`")
                through = f" through `{'` and `'.join(written.via)}`" if written.via else ""
                scaler = visible[0]
                ctx.report(call, f"checkpoint written by `{ctx.code(call.func)}(...)` ({where}{through}) without the "
                                 f"GradScaler's state: `{scaler.code}` (line {_line(ctx, scaler.node)}) is not passed "
                                 "to it, so a resumed run restarts its loss scale",
                           related=(related, Related(ctx.path, _line(ctx, scaler.node), f"`{scaler.code}`")))

    @staticmethod
    def _callees(ctx: FileContext, unit: cst.CSTNode) -> dict[int, list[cst.FunctionDef]]:
        """For each function of a unit (a method, or a module-level function), those of the same
        unit it calls (``self.save(...)``, ``save(...)``), itself and the functions it defines
        included."""
        cache = ctx.__dict__.setdefault("_amp015_callees", {})
        if id(unit) not in cache:
            body = unit.body.body if isinstance(unit, cst.ClassDef) else unit.body
            by_name = {f.name.value: f for f in body if isinstance(f, cst.FunctionDef)}
            direct = {}
            for function in by_name.values():
                direct[id(function)] = [function] + [
                    by_name[last_name(c.func)] for c in ctx.nodes_within(cst.Call, function)
                    if (isinstance(c.func, cst.Name) or _self_call(c))
                    and last_name(c.func) in by_name and _self_call(c) is isinstance(unit, cst.ClassDef)]
            reach = {}
            for key, first in direct.items():
                seen, stack = {}, list(first)
                while stack:
                    function = stack.pop()
                    if id(function) not in seen:
                        seen[id(function)] = function
                        stack.extend(direct.get(id(function), ()))
                reach[key] = list(seen.values())
            cache[id(unit)] = reach
        return cache[id(unit)]

    def _visible(self, ctx: FileContext, node: cst.CSTNode, unit: cst.CSTNode,
                 unit_scalers: list[Scaler]) -> list[Scaler]:
        """The scalers that the code at ``node`` runs with, nearest first: those of its function
        or one around it, then the class's (``self.scaler``) and the module's, then the locals of
        functions that call it."""
        functions = [a for a in ctx.ancestors(node) if isinstance(a, cst.FunctionDef)]
        around = {id(f) for f in functions}
        callees = self._callees(ctx, unit)
        near, shared, callers = [], [], []
        for scaler in unit_scalers:
            if scaler.function is not None and id(scaler.function) in around:
                near.append(scaler)
            elif scaler.function is None or scaler.code.startswith("self."):
                shared.append(scaler)
            else:
                top = next((a for a in [scaler.function, *ctx.ancestors(scaler.function)]
                            if id(a) in callees), None)
                if top is not None and any(ctx.contains(f, node) for f in callees[id(top)]):
                    callers.append(scaler)
        return near + shared + callers

    @staticmethod
    def _in_unit(ctx: FileContext, unit: cst.CSTNode, kind: type) -> list:
        return ctx.nodes_in(kind, cst.ClassDef, None if unit is ctx.module else unit)

    @staticmethod
    def _is_scaler(ctx: FileContext, expr: cst.BaseExpression, unit_scalers: list[Scaler]) -> bool:
        """A scaler of the unit, the object holding one, or something named like a scaler."""
        code = spelled(ctx, expr)
        return (isinstance(expr, (cst.Name, cst.Attribute)) and named_like_scaler(code)) \
            or any(holds(code, s.code) for s in unit_scalers)

    def _saved(self, ctx: FileContext, unit: cst.CSTNode, unit_scalers: list[Scaler]) -> bool:
        cache = ctx.__dict__.setdefault("_amp015_saved", {})
        if id(unit) not in cache:
            cache[id(unit)] = self._saves_scaler(ctx, unit, unit_scalers)
        return cache[id(unit)]

    def _saves_scaler(self, ctx: FileContext, unit: cst.CSTNode, unit_scalers: list[Scaler]) -> bool:
        for call in self._in_unit(ctx, unit, cst.Call):
            if last_name(call.func) == "state_dict" and isinstance(call.func, cst.Attribute) \
                    and self._is_scaler(ctx, call.func.value, unit_scalers):
                return True
            if not name_words(call.func).isdisjoint(_CHECKPOINT_WORDS) and not restores_from_checkpoint(call) \
                    and any(self._is_scaler(ctx, a.value, unit_scalers) for a in call.args):
                return True
        for node in self._in_unit(ctx, unit, cst.DictElement):
            if "scaler" in (key_text(node.key) or ""):
                return True
        for node in self._in_unit(ctx, unit, cst.Assign):
            target = node.targets[0].target
            if isinstance(target, cst.Subscript) and _names_scaler(target):
                return True
        return False

    def _restored(self, ctx: FileContext, unit: cst.CSTNode, unit_scalers: list[Scaler]) -> bool:
        cache = ctx.__dict__.setdefault("_amp015_restored", {})
        if id(unit) not in cache:
            cache[id(unit)] = self._restores_scaler(ctx, unit, unit_scalers)
        return cache[id(unit)]

    def _restores_scaler(self, ctx: FileContext, unit: cst.CSTNode, unit_scalers: list[Scaler]) -> bool:
        for call in self._in_unit(ctx, unit, cst.Call):
            name = last_name(call.func).lower()
            if name == "load_state_dict" and isinstance(call.func, cst.Attribute) \
                    and self._is_scaler(ctx, call.func.value, unit_scalers):
                return True
            if name in ("get", "pop") and call.args and "scaler" in (key_text(call.args[0].value) or ""):
                return True
            if restores_from_checkpoint(call) and self._restores(
                    ctx, call, lambda e: self._is_scaler(ctx, e, unit_scalers)):
                return True
        stores = {id(t.target) for node in self._in_unit(ctx, unit, cst.Assign) for t in node.targets}
        for node in self._in_unit(ctx, unit, cst.Subscript):
            if id(node) not in stores and _names_scaler(node):
                return True
        return False

    @staticmethod
    def _restores(ctx: FileContext, call: cst.Call, is_scaler) -> bool:
        """A restore call given the scaler (or its holder), or whose result is assigned to it."""
        if any(is_scaler(a.value) for a in call.args):
            return True
        statement = statement_of(ctx, call)
        assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        return isinstance(assign, cst.Assign) and assign.value is call and any(
            isinstance(n, (cst.Name, cst.Attribute)) and is_scaler(n)
            for t in assign.targets for n in subexpressions(t.target))

    def _replaced_after_restore(self, ctx: FileContext) -> None:
        for creation, code in scaler_creations(ctx):
            function = enclosing_function(ctx, creation)
            if function is None:
                continue
            statement = statement_of(ctx, creation)
            block = ctx.parent(statement)
            earlier = [c for c in self._restores_in(ctx, function, code)
                       if ctx.order(c) < ctx.order(creation) and ctx.contains(block, c)]
            if earlier:
                ctx.report(statement, "a new GradScaler replaces the scaler restored at line "
                                      f"{_line(ctx, earlier[0])}: its loss scale restarts; keep the restored one")
                continue
            method_of = ctx.parent(ctx.parent(function))
            if not isinstance(method_of, cst.ClassDef) or block is not function.body:
                continue
            init = next((m for m in method_of.body.body
                         if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"), None)
            # What `__init__` runs, the methods it calls included; a method it calls itself may
            # create the scaler before the restore, so it is left alone.
            setup = self._callees(ctx, method_of).get(id(init), [])
            if any(f is function for f in setup):
                continue
            restored = [c for f in setup for c in self._restores_in(ctx, f, code)]
            if restored:
                ctx.report(statement, f"a new GradScaler replaces `{code}`, which `__init__` restored from a "
                                      f"checkpoint at line {_line(ctx, restored[0])}: its loss scale restarts; "
                                      "create the scaler before the checkpoint is loaded")

    def _restores_in(self, ctx: FileContext, function: cst.FunctionDef, code: str) -> list[cst.Call]:
        """Calls directly in ``function`` that restore the scaler held by ``code``, or the object holding it."""
        found = []
        for call in ctx.nodes_in(cst.Call, cst.FunctionDef, function):
            if last_name(call.func) == "load_state_dict" and isinstance(call.func, cst.Attribute) \
                    and holds(spelled(ctx, call.func.value), code):
                found.append(call)
            elif restores_from_checkpoint(call) and self._restores(ctx, call, lambda e: holds(spelled(ctx, e), code)):
                found.append(call)
        return found

