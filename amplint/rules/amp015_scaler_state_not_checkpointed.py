from __future__ import annotations

import ast
from pathlib import Path

from ..engine.ast_context import AstContext
from ..engine.checkpoints import (FUNCTIONS, Scaler, ScalerTest, ancestors, argument_values, body_of,
                                  checkpoints, holds, in_block, in_unit, last_name, named, named_like_scaler,
                                  optimizer_restores, restores_of, restores_scaler, saves_scaler, scaler_creations,
                                  scalers, spelled, unit_of)
from ..engine.crossfile import located
from ..engine.diagnostics import Related
from ..engine.outline import contains
from ..engine.rule import AnyOf, Invalid, Rule, Valid
from ..engine.summaries import callee_summary


def _self_call(call: ast.Call) -> bool:
    """``self.method(...)``."""
    return isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
        and call.func.value.id == "self"


def _scaler_test(unit_scalers: list[Scaler]) -> ScalerTest:
    """A scaler of the unit, the object holding one, or something named like a scaler."""
    return lambda code, is_named: is_named and named_like_scaler(code) or any(holds(code, s.code) for s in unit_scalers)


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
    checkpoint converted, then handed to a `load...` call) is no checkpoint; a call that reads
    another binding of its name (`ckpt = torch.load(w)` handed to a resume, `ckpt = {...}` saved
    later in the epoch loop) does not make it one. An optimizer given its own live state back
    (`state = move_to_device(optimizer.state_dict(), device)`, then
    `optimizer.load_state_dict(state)`) restores nothing.
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

    valid = (
        # No optimizer's state saved; a scaler that is no GradScaler; the scaler's state saved.
        Valid("""
import torch
scaler = torch.amp.GradScaler()
state = model.state_dict()
torch.save(model.state_dict(), p)
"""),
        Valid("""
from torch import save
scaler = LossScaler()
save(optimizer.state_dict(), p)
"""),
        Valid("""
import torch
def save(opt, scaler, p):
    torch.save({'opt': opt.state_dict(), 'scaler': scaler.state_dict()}, p)
"""),
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

    def check(self, ctx: AstContext) -> None:
        by_unit: dict[int, list[Scaler]] = {}
        for scaler in scalers(ctx):
            by_unit.setdefault(id(unit_of(ctx, scaler.node)), []).append(scaler)
        if not by_unit:
            return
        self._replaced_after_restore(ctx)
        restores: dict[int, list[ast.Call]] = {}
        for call in optimizer_restores(ctx):
            restores.setdefault(id(unit_of(ctx, call)), []).append(call)
        reported_units: set[int] = set()
        for node in checkpoints(ctx):
            unit = unit_of(ctx, node)
            visible = self._visible(ctx, node, unit, by_unit.get(id(unit), []))
            if not visible or self._saved(ctx, unit, by_unit[id(unit)]):
                continue
            reported_units.add(id(unit))
            message = (f"checkpoint without the GradScaler's state: `{visible[0].code}` (line "
                       f"{visible[0].node.lineno}) is not saved, so a resumed run restarts its loss scale")
            unrestored = next((c for c in restores.get(id(unit), ()) if self._visible(ctx, c, unit, visible)), None)
            if unrestored is not None and not self._restored(ctx, unit, by_unit[id(unit)]):
                message += f"; the resume at line {unrestored.lineno} does not restore it either"
            ctx.report(node, message)
        self._written_by_helpers(ctx, by_unit, reported_units)
        for key, calls in restores.items():
            unit = unit_of(ctx, calls[0])
            if key in reported_units or key not in by_unit or self._restored(ctx, unit, by_unit[key]):
                continue
            seen_functions: set[int] = set()
            for call in calls:
                function = id(ctx.enclosing_function(call))
                visible = self._visible(ctx, call, unit, by_unit[key])
                if function in seen_functions or not visible:
                    continue
                seen_functions.add(function)
                ctx.report(call, f"optimizer state restored without the GradScaler's: `{visible[0].code}` (line "
                                 f"{visible[0].node.lineno}) is not restored, so its loss scale restarts; "
                                 f"call `{visible[0].code}.load_state_dict(...)` here")

    def _written_by_helpers(self, ctx: AstContext, by_unit: dict[int, list[Scaler]], reported: set[int]) -> None:
        """Where a scaler is in use, a call of another module's function that writes a checkpoint
        with an optimizer's state and without the scaler's (``summaries``), when nothing passes
        the scaler to it and the project saves no scaler's state anywhere."""
        for key, unit_scalers in by_unit.items():
            unit = unit_of(ctx, unit_scalers[0].node)
            if key in reported or self._saved(ctx, unit, unit_scalers):
                continue
            is_scaler = _scaler_test(unit_scalers)
            for call in in_unit(ctx, unit, ast.Call):
                # the scaler, or an object that holds it (`self` too: the helper may save its scaler)
                if any(is_scaler(spelled(ctx, v), named(v)) or isinstance(v, ast.Name) and v.id == "self"
                       for v in argument_values(call)):
                    continue
                visible = self._visible(ctx, call, unit, unit_scalers)
                summary = callee_summary(ctx, call) if visible else None
                if summary is None or summary.place.path.resolve() == Path(ctx.path).resolve():
                    continue
                written = next((c.place for c in summary.checkpoints
                                if c.optimizer_state and not c.scaler_state and not c.from_caller), None)
                if written is None or ctx.scaler_states_saved():
                    continue
                where, related = located(ctx, written.path, written.row,
                                         f"`{written.code}`, in `{(summary.name, *written.via)[-1]}`")
                through = f" through `{'` and `'.join(written.via)}`" if written.via else ""
                scaler = visible[0]
                ctx.report(call, f"checkpoint written by `{ctx.code(call.func)}(...)` ({where}{through}) without the "
                                 f"GradScaler's state: `{scaler.code}` (line {scaler.node.lineno}) is not passed "
                                 "to it, so a resumed run restarts its loss scale",
                           related=(related, Related(ctx.path, scaler.node.lineno, f"`{scaler.code}`")))

    @staticmethod
    def _callees(ctx: AstContext, unit: ast.ClassDef | ast.Module) -> dict[int, list[ast.FunctionDef]]:
        """For each function of a unit (a method, or a module-level function), those of the same
        unit it calls (``self.save(...)``, ``save(...)``), itself and the functions it defines
        included."""
        cache = ctx.__dict__.setdefault("_amp015_callees", {})
        if id(unit) not in cache:
            in_class = isinstance(unit, ast.ClassDef)
            by_name = {f.name: f for f in unit.body if isinstance(f, FUNCTIONS)}
            direct = {}
            for function in by_name.values():
                direct[id(function)] = [function] + [
                    by_name[last_name(c.func)] for c in ctx.calls_within(function)
                    if (_self_call(c) if in_class else isinstance(c.func, ast.Name)) and last_name(c.func) in by_name]
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

    def _visible(self, ctx: AstContext, node: ast.AST, unit: ast.AST, unit_scalers: list[Scaler]) -> list[Scaler]:
        """The scalers that the code at ``node`` runs with, nearest first: those of its function
        or one around it, then the class's (``self.scaler``) and the module's, then the locals of
        functions that call it."""
        around = {id(a) for a in ancestors(ctx, node) if isinstance(a, FUNCTIONS)}
        callees = self._callees(ctx, unit)
        near, shared, callers = [], [], []
        for scaler in unit_scalers:
            if scaler.function is not None and id(scaler.function) in around:
                near.append(scaler)
            elif scaler.function is None or scaler.code.startswith("self."):
                shared.append(scaler)
            else:
                top = next((a for a in [scaler.function, *ancestors(ctx, scaler.function)] if id(a) in callees), None)
                if top is not None and any(contains(f, node) for f in callees[id(top)]):
                    callers.append(scaler)
        return near + shared + callers

    @staticmethod
    def _saved(ctx: AstContext, unit: ast.AST, unit_scalers: list[Scaler]) -> bool:
        cache = ctx.__dict__.setdefault("_amp015_saved", {})
        if id(unit) not in cache:
            cache[id(unit)] = saves_scaler(ctx, unit, _scaler_test(unit_scalers))
        return cache[id(unit)]

    @staticmethod
    def _restored(ctx: AstContext, unit: ast.AST, unit_scalers: list[Scaler]) -> bool:
        cache = ctx.__dict__.setdefault("_amp015_restored", {})
        if id(unit) not in cache:
            cache[id(unit)] = restores_scaler(ctx, unit, _scaler_test(unit_scalers))
        return cache[id(unit)]

    def _replaced_after_restore(self, ctx: AstContext) -> None:
        for creation, code in scaler_creations(ctx):
            function = ctx.enclosing_function(creation)
            if function is None:
                continue
            earlier = [c for c in restores_of(ctx, function, code)
                       if ctx.order(c) < ctx.order(creation) and in_block(ctx, creation, c)]
            if earlier:
                ctx.report(creation, "a new GradScaler replaces the scaler restored at line "
                                      f"{earlier[0].lineno}: its loss scale restarts; keep the restored one")
                continue
            method_of = ctx.parent(function)
            if not isinstance(method_of, ast.ClassDef) or not body_of(ctx, creation, function):
                continue
            init = next((m for m in method_of.body if isinstance(m, FUNCTIONS) and m.name == "__init__"), None)
            # What `__init__` runs, the methods it calls included; a method it calls itself may
            # create the scaler before the restore, so it is left alone.
            setup = self._callees(ctx, method_of).get(id(init), [])
            if any(f is function for f in setup):
                continue
            restored = [c for f in setup for c in restores_of(ctx, f, code)]
            if restored:
                ctx.report(creation, f"a new GradScaler replaces `{code}`, which `__init__` restored from a "
                                      f"checkpoint at line {restored[0].lineno}: its loss scale restarts; "
                                      "create the scaler before the checkpoint is loaded")
