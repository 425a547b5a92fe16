"""A function's flow (``flow.flows``' events and structure) with the methods it calls on
``self`` inlined: ``self._optimizer_step()`` stands for the body of ``_optimizer_step``, so a
trainer that scales the loss in one method, steps in a second and updates in a third is one
iteration to a rule. Only a method of a class that itself backpropagates, steps, updates or
unscales is followed, and only where it and its own class's methods reach a backward and a
step or update (or one of them, with the rest left to a base): the bases are read then.

A method is found as Python finds it on an instance of the function's class: the class's own
body, then its bases (classes of the file, or classes imported from a module of the project),
depth first; a base that cannot be read (another library's) ends the search, since it may
define the name first. A callee's ``return`` continues after the call; its ``raise`` leaves
the caller too. Calls are followed ``MAX_DEPTH`` deep, never into a method already on the way,
a generator, a coroutine, or a method with a ``return`` inside a loop (it stays a call whose
events are out of sight, ``MethodFlow.hides``).

Events of a callee are ``Reached`` events: their ``hops`` lead to them from the analysed
function, outermost call first, each with the module it is in (a base class's module may be
another file). Their scaler and optimizer are spelled as the caller spells them where the
callee reads a parameter (``self._step(self.opt)`` into ``def _step(self, optimizer)``).
A ``return`` statement is an event here too (``RETURN``), just before its exit.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterator

import libcst as cst

from . import flow
from .context import FileContext
from .crossfile import imported_as, located
from .diagnostics import Related
from .flow import Event, Exit, Flow, Loop, line_of
from .outline import Outline, contains
from .semantics import bind, called_function, enclosing_function, method_call, scaled_backward_scaler

MAX_DEPTH = 3  # calls followed from the analysed function
_MAX_BASES = 8  # classes read up a hierarchy
RETURN = "return"

# Method names whose calls may make an event (a scaler's or an optimizer's, a backward): a
# method calling none of them, directly or through ``self``, is not followed.
_EVENT_METHODS = frozenset({"backward", "step", "update", "unscale_"})
_SCALER_STATE = frozenset({"step", "unscale_", "update"})  # what records or clears inf checks
_SPELLED = (cst.Name, cst.Attribute)  # arguments a callee's parameter may stand for


@dataclass(frozen=True)
class Hop:
    call: cst.Call  # ``self.m(...)``
    home: FileContext  # the module the call is in
    method: cst.FunctionDef  # ``m``
    method_home: FileContext  # the module ``m`` is in


@dataclass(frozen=True)
class Reached(Event):
    hops: tuple[Hop, ...] = ()


def home(ctx: FileContext, event: Event) -> FileContext:
    """The module ``event``'s node is in (``ctx``: the analysed file)."""
    return event.hops[-1].method_home if isinstance(event, Reached) else ctx


def hops(event: Event) -> tuple[Hop, ...]:
    return event.hops if isinstance(event, Reached) else ()


def site(ctx: FileContext, event: Event) -> cst.CSTNode:
    """Where a finding about ``event`` sits in the analysed file: its own node, or, for an
    event of another module, the call in this file that leads there."""
    if home(ctx, event) is ctx:
        return event.node
    return next(h.call for h in reversed(event.hops) if h.home is ctx)


def order(ctx: FileContext, event: Event) -> tuple[int, ...]:
    """The order in which one flow's events run: by the calls that lead to them, then by their
    own place."""
    return (*(h.home.order(h.call) for h in hops(event)), home(ctx, event).order(event.node))


@dataclass
class MethodFlow:
    flow: Flow
    function: cst.FunctionDef | None
    # The loops that stand for inlined calls (by id), and the call each runs.
    wrappers: dict[int, Hop]
    # The calls of the function and its inlined methods that make no event and were not
    # inlined, with the module each is in and the lowering that met it (None: not inlining).
    opaque: list[tuple[cst.Call, FileContext, "_Inlining | None"]]

    def parameters(self) -> frozenset[str]:
        """The function's parameters but the instance's (``self``, ``cls``)."""
        if self.function is None:
            return frozenset()
        return frozenset(p.name.value for p in flow._params(self.function.params)) - {"self", "cls"}

    def hides(self, scaler: str) -> bool:
        """Whether the code may step, unscale or update ``scaler`` where the flow does not show
        it: it passes the scaler to a call (nerfstudio's ``optimizer_scaler_step_some(
        self.grad_scaler, ...)``), or calls a method of the class left out (too deep, a return
        in a loop) or a function of its module that steps, unscales or updates it."""
        for call, where, lowering in self.opaque:
            if lowering is not None and lowering.touches(call):
                return True
            if any((lowering.canonical(a.value) if lowering is not None and isinstance(a.value, _SPELLED)
                    else where.code(a.value)) == scaler for a in call.args):
                return True
            helper = called_function(where, call)
            if helper is not None and any((mc := method_call(c)) is not None and mc[1] in _SCALER_STATE
                                          and where.code(mc[0]) == scaler
                                          for c in where.nodes_within(cst.Call, helper)):
                return True
        return False

    def loops(self) -> Iterator[tuple[Loop, tuple[Hop, ...]]]:
        """The flow's loops (not those standing for calls), with the calls that lead to each."""
        stack: list[tuple[list, tuple[Hop, ...]]] = [(self.flow.block, ())]
        while stack:
            block, through = stack.pop()
            for item in block:
                if isinstance(item, Loop):
                    hop = self.wrappers.get(id(item))
                    if hop is None:
                        yield item, through
                    stack.append((item.body + item.orelse, through + (hop,) if hop else through))
                elif isinstance(item, flow.Branch):
                    stack.append((item.body + item.orelse, through))
                elif isinstance(item, flow.Try):
                    stack.append(([i for part in (item.body, *item.handlers, item.orelse, item.final) for i in part],
                                  through))

    def every_iteration(self, loop: Loop, kind: str) -> list[Event]:
        """The events of ``kind`` that every iteration of ``loop`` runs alike, as far as no
        condition on what the loop changes comes first (``if iopt != optim_idx: continue``
        lets only some items through)."""
        return _every_iteration(loop.body, loop.assigned, kind, self.wrappers)[0]


def _every_iteration(block: list, varying: frozenset[str], kind: str, wrappers: dict) -> tuple[list[Event], bool]:
    """``MethodFlow.every_iteration`` in ``block``, and whether an exit under a condition on
    ``varying`` (or any exit) comes first on some path: then nothing later counts."""
    found: list[Event] = []
    for item in block:
        if isinstance(item, Event) and item.kind == kind:
            found.append(item)
        elif isinstance(item, Exit):
            return found, item.kind != "raise"
        elif isinstance(item, flow.Branch) and item.atom.reads & varying:
            if any(isinstance(i, Exit) for i in flow.items(item.body + item.orelse)):
                return found, True
        elif isinstance(item, (flow.Branch, flow.Try)) or isinstance(item, Loop) and id(item) in wrappers:
            # (not an inner loop: what it holds runs once per its own iterations)
            inner = varying | item.assigned if isinstance(item, Loop) else varying  # a callee's names vary too
            parts = [item.body + item.final] if isinstance(item, flow.Try) else [item.body, item.orelse]
            for part in parts:
                more, stopped = _every_iteration(part, inner, kind, wrappers)
                found += more
                if stopped and not isinstance(item, Loop):  # a callee's return ends only the callee
                    return found, True
    return found, False


def _hierarchy(ctx: FileContext, cls: cst.ClassDef) -> "_Hierarchy":
    cache = ctx.__dict__.setdefault("_hierarchies", {})
    if id(cls) not in cache:
        cache[id(cls)] = _Hierarchy(ctx, cls)
    return cache[id(cls)]


def method_flows(ctx: FileContext) -> list[MethodFlow]:
    """The module's own code and every function of the file that makes an event or calls a
    method of ``self``, lowered with those calls inlined."""
    found = []
    for lowered in flow.flows(ctx):
        scope = lowered.scope
        function = scope if isinstance(scope, cst.FunctionDef) else None
        cls = ctx.enclosing(scope, cst.ClassDef) if function is not None else None
        hierarchy = _hierarchy(ctx, cls) if cls is not None and _may_make_events(ctx, cls) else None
        if hierarchy is not None and _worth_following(hierarchy, ctx, scope, cls):
            lowering = _Inlining(ctx, scope, hierarchy, ())
            inlined = lowering.flow()
            events = sorted(inlined.events + lowering.reached, key=lambda e: order(ctx, e))
            # Its opaque calls name the lowering that met each: handed over, not kept on it too
            # (a cycle through the lowering would keep the check's context alive past the check).
            opaque, lowering.opaque = lowering.opaque, []
            found.append(MethodFlow(replace(inlined, events=events), function, lowering.wrappers, opaque))
        elif lowered.events:
            returns: list[Event] = []
            block = _with_returns(lowered.block, returns)
            events = sorted(lowered.events + returns, key=lambda e: order(ctx, e))
            made = {id(e.node) for e in lowered.events}
            opaque = [(c, ctx, None) for c in ctx.nodes_within(cst.Call, scope)
                      if id(c) not in made and enclosing_function(ctx, c) is function]
            found.append(MethodFlow(Flow(scope, block, events), function, {}, opaque))
    # Not kept on the context: the flows refer to it, and a cycle through the context would
    # keep the whole tree alive past the check (AMP006 asks once per file).
    return found


def _worth_following(hierarchy: "_Hierarchy", ctx: FileContext, function: cst.FunctionDef, cls: cst.ClassDef) -> bool:
    """Whether following the function's calls may give it both halves of an iteration, a
    backward and a step or update: by what it and the methods of its own class call, the rest
    left to the bases (read only then)."""
    names = hierarchy.reaches(ctx, function, own=True)
    halves = ("backward" in names) + (not names.isdisjoint({"step", "update"}))
    return halves == 2 or halves == 1 and any(
        base.keyword is None and not (isinstance(base.value, cst.Name) and base.value.value == "object")
        for base in cls.bases)


def _with_returns(block: list, returns: list[Event]) -> list:
    """A copy of a lowered block with a ``RETURN`` event before each return (the block is
    another rule's too)."""
    out = []
    for item in block:
        if isinstance(item, Exit) and item.kind == "return":
            returns.append(Event(RETURN, item.node))
            out.append(returns[-1])
        elif isinstance(item, flow.Branch):
            item = flow.Branch(item.atom, _with_returns(item.body, returns), _with_returns(item.orelse, returns),
                               item.shared, item.last)
        elif isinstance(item, Loop):
            item = Loop(item.node, _with_returns(item.body, returns), _with_returns(item.orelse, returns),
                        item.assigned)
        elif isinstance(item, flow.Try):
            item = flow.Try(_with_returns(item.body, returns), [_with_returns(h, returns) for h in item.handlers],
                            _with_returns(item.orelse, returns), _with_returns(item.final, returns))
        out.append(item)
    return out


# -- the class's methods -------------------------------------------------------------------

class _Hierarchy:
    """The classes ``self`` may be an instance of, in the order Python looks a method up in
    them (depth first over the bases), as far as they can be read."""

    def __init__(self, ctx: FileContext, cls: cst.ClassDef):
        self.classes: list[tuple[FileContext, cst.ClassDef]] = []  # those read so far
        self.own = cls
        self._unread = self._bases(ctx, cls, 0)
        self._ended = False  # at a base that cannot be read: a later one may define a name it does
        self._reaches: dict[tuple[int, bool], frozenset[str]] = {}
        self._methods: dict[str, tuple[FileContext, cst.FunctionDef] | None] = {}
        # What the file sets on ``self``: attributes (``self.model(x)``), not methods.
        self.attributes = {ctx.code(t.target)[5:] for a in ctx.nodes(cst.Assign) for t in a.targets
                           if ctx.code(t.target).startswith("self.")}

    def _bases(self, ctx: FileContext, cls: cst.ClassDef, depth: int) -> Iterator[tuple[FileContext, cst.ClassDef]]:
        """The class and its bases, depth first, read only as far as a lookup asks."""
        yield ctx, cls
        for base in cls.bases:
            if self._ended or depth >= _MAX_BASES:
                return
            if base.keyword is not None or isinstance(base.value, cst.Name) and base.value.value == "object":
                continue
            found = _class_named(ctx, base.value)
            if found is None:
                self._ended = True
                return
            yield from self._bases(*found, depth + 1)

    def method(self, name: str, own: bool = False) -> tuple[FileContext, cst.FunctionDef] | None:
        """The method ``self.name`` runs, if it is a plain one the hierarchy defines (``own``:
        the class itself, its bases left unread)."""
        if own and not any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in self.own.body.body):
            return None
        if name not in self._methods:
            self._methods[name] = None if name in self.attributes else self._lookup(name)
        return self._methods[name]

    def _lookup(self, name: str) -> tuple[FileContext, cst.FunctionDef] | None:
        index = 0
        while True:
            if index == len(self.classes):
                found = next(self._unread, None)
                if found is None:
                    return None
                self.classes.append(found)
            where, cls = self.classes[index]
            defined = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
            if defined:
                return (where, defined[-1]) if _followable(where, defined[-1]) else None
            index += 1

    def relevant(self, where: FileContext, method: cst.FunctionDef) -> bool:
        """Whether ``method`` calls something that may make an event, itself or through a
        method of ``self``."""
        return bool(self.reaches(where, method))

    def reaches(self, where: FileContext, code: cst.CSTNode, own: bool = False, depth: int = 0) -> frozenset[str]:
        """The methods that may make an event (``_EVENT_METHODS``) that ``code`` calls, itself
        or through methods of ``self`` ``MAX_DEPTH`` deep (``own``: of the class itself)."""
        key = (id(code), own)
        if key not in self._reaches:
            self._reaches[key] = frozenset()  # a method calling itself adds nothing
            found: set[str] = set()
            for call in where.nodes_within(cst.Call, code):
                name = _self_method(call)
                target = self.method(name, own) if name is not None and depth < MAX_DEPTH else None
                if target is not None:
                    found |= self.reaches(*target, own, depth + 1)
                elif (mc := method_call(call)) is not None and mc[1] in _EVENT_METHODS:
                    found.add(mc[1])
            self._reaches[key] = frozenset(found)
        return self._reaches[key]


def _may_make_events(ctx: FileContext, cls: cst.ClassDef) -> bool:
    """Whether the class itself calls something that may make an event: the methods of one
    that never does are not followed (into its bases either)."""
    cache = ctx.__dict__.setdefault("_classes_making_events", {})
    if id(cls) not in cache:
        cache[id(cls)] = any((mc := method_call(c)) is not None and mc[1] in _EVENT_METHODS
                             for c in ctx.nodes_within(cst.Call, cls))
    return cache[id(cls)]


def _class_named(ctx: FileContext, expr: cst.BaseExpression) -> tuple[FileContext, cst.ClassDef] | None:
    """The class a base names: one defined at the top of this module, or of the project
    module it is imported from."""
    if isinstance(expr, cst.Name):
        local = _top_class(ctx, expr.value)
        if local is not None:
            return ctx, local
    for module, level, name in imported_as(ctx, expr):
        other = ctx.project_module(module, level)
        found = _top_class(other, name) if other is not None else None
        if found is not None:
            return other, found
    return None


def _top_class(ctx: FileContext, name: str) -> cst.ClassDef | None:
    return next((s for s in ctx.module.body if isinstance(s, cst.ClassDef) and s.name.value == name), None)


def _followable(ctx: FileContext, method: cst.FunctionDef) -> bool:
    """A plain method: not a coroutine, a generator, or a property (``self.m()`` then runs
    something else than its body)."""
    if method.asynchronous is not None or _decorated(ctx, method, "property", "cached_property"):
        return False
    return not any(ctx.enclosing(y, (cst.FunctionDef, cst.Lambda)) is method
                   for y in ctx.nodes_within(cst.Yield, method))


def _decorated(ctx: FileContext, method: cst.FunctionDef, *names: str) -> bool:
    return any(ctx.code(d.decorator).split(".")[-1] in names for d in method.decorators)


def _self_method(call: cst.Call) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        return func.attr.value
    return None


# -- lowering ------------------------------------------------------------------------------

_ROOT = re.compile(r"[A-Za-z_]\w*")


class _Inlining(flow._Lowering):
    def __init__(self, ctx: FileContext, scope: cst.CSTNode, hierarchy: _Hierarchy | None,
                 hops_: tuple[Hop, ...], bound: dict[str, str] | None = None):
        super().__init__(ctx, scope)
        self.hierarchy = hierarchy
        self.hops = hops_
        self.bound = bound or {}  # a callee's parameters: how the caller spells their arguments
        self.reached: list[Event] = []  # events of inlined methods
        self.opaque: list[tuple[cst.Call, FileContext, _Inlining | None]] = []
        self.wrappers: dict[int, Hop] = {}

    def spelled(self, text: str) -> str:
        """``text`` as the caller spells it, where it reads a parameter of the callee."""
        match = _ROOT.match(text)
        if match is None or match.group() not in self.bound:
            return text
        return self.bound[match.group()] + text[match.end():]

    def canonical(self, expr: cst.BaseExpression) -> str:
        text = flow._text(self.ctx, expr)
        return self.aliases[text] if text in self.aliases else self.spelled(text)

    def _assign_text(self, text: str) -> None:
        super()._assign_text(text)
        self.bound.pop(text, None)  # the parameter now holds something else

    def _event(self, event: Event) -> Event:
        if event.kind == flow.SCALED_BACKWARD:
            raw = scaled_backward_scaler(self.ctx, event.node)
            event = replace(event, scaler=self.aliases.get(raw) or self.spelled(raw))
        if self.hops:
            event = Reached(**{f.name: getattr(event, f.name) for f in fields(Event)}, hops=self.hops)
        return super()._event(event)

    def _small(self, node: cst.CSTNode) -> list:
        out = super()._small(node)
        if isinstance(node, cst.Return):
            out.insert(len(out) - 1, self._event(Event(RETURN, node)))
        return out

    def _events_in(self, node: cst.CSTNode) -> list:
        out: list = []
        for call in flow._calls_within(self.ctx, node):
            # A method of the class first: `self.backward(loss)` may scale the loss.
            inlined = self._inline(call)
            if inlined is not None:
                out.append(inlined)
                continue
            event = self._call_event(call)
            if event is not None:
                out.append(event)
            else:
                self.opaque.append((call, self.ctx, self))
        return out

    def touches(self, call: cst.Call) -> bool:
        """Whether a call left out runs a method of ``self`` that may make an event."""
        name = _self_method(call)
        target = self.hierarchy.method(name) if name is not None and self.hierarchy is not None else None
        return target is not None and self.hierarchy.relevant(*target)

    def _inline(self, call: cst.Call) -> Loop | None:
        """The callee's body for ``self.m(...)``, as a loop run once whose breaks are its returns."""
        name = _self_method(call)
        if name is None or self.hierarchy is None or len(self.hops) >= MAX_DEPTH:
            return None
        target = self.hierarchy.method(name)
        if target is None or not self.hierarchy.relevant(*target):
            return None
        where, method = target
        if method is self.scope or any(h.method is method for h in self.hops):
            return None
        params = [p.name.value for p in flow._params(method.params)]
        arguments = bind(call, params if _decorated(where, method, "staticmethod") else params[1:])
        if arguments is None:
            return None
        hop = Hop(call, self.ctx, method, where)
        callee = _Inlining(where, method, self.hierarchy, self.hops + (hop,))
        callee.counter = self.counter  # versions of the callee's atoms stay apart from the caller's
        callee.assigned_stack.append(set())
        for param in params:
            callee._assign_text(param)
        callee.bound = {name: self.canonical(arg.value) for name, arg in arguments.items()
                        if not (isinstance(arg.value, cst.Name) and arg.value.value in ("None", "True", "False"))}
        # `self` is the same object: the caller's scalers on it are the callee's too
        callee.scalers = callee.scalers | {text for text in callee.bound.values() if text in self.scalers} \
            | {text for text in self.scalers if text.startswith("self.")}
        block = _returns_as_breaks(callee._block(method.body.body))
        self.counter = callee.counter
        opaque, callee.opaque = callee.opaque, []  # handed over, not kept on the callee too (see method_flows)
        if block is None:
            return None
        wrapper = Loop(call, block, [], frozenset(callee.assigned_stack.pop()))
        self.reached += callee.events + callee.reached
        self.opaque += opaque
        self.wrappers[id(wrapper)] = hop
        self.wrappers.update(callee.wrappers)
        return wrapper


def _returns_as_breaks(block: list) -> list | None:
    """A callee's block with its returns as breaks of the loop that stands for the call;
    None when one is inside a loop of its own (a break there would end that loop only)."""
    out = []
    for item in block:
        if isinstance(item, Exit) and item.kind == "return":
            item = Exit("break", item.node)
        elif isinstance(item, flow.Branch):
            body, orelse = _returns_as_breaks(item.body), _returns_as_breaks(item.orelse)
            if body is None or orelse is None:
                return None
            item = flow.Branch(item.atom, body, orelse)
        elif isinstance(item, flow.Try):
            parts = [_returns_as_breaks(p) for p in (item.body, *item.handlers, item.orelse, item.final)]
            if any(p is None for p in parts):
                return None
            item = flow.Try(parts[0], parts[1:-2], parts[-2], parts[-1])
        elif isinstance(item, Loop) and any(isinstance(i, Exit) and i.kind == "return" for i in flow.items(item.body)):
            return None
        out.append(item)
    return out


# -- naming a reached event in a message ---------------------------------------------------

def place(ctx: FileContext, event: Event, seen: tuple[Hop, ...] = ()) -> str:
    """How a message names where an event is: its line, and for an event of a method the
    function calls, the method and the first call leading there that the message has not
    named yet (``seen``: the calls that lead to what the finding is about)."""
    chain = hops(event)
    text = _line(ctx, home(ctx, event), event.node)
    if chain:
        text += f" in `{chain[-1].method.name.value}`"
        shared = next((i for i, (a, b) in enumerate(zip(chain, seen)) if a != b), min(len(chain), len(seen)))
        if shared < len(chain):
            text += f", run by `{call_text(chain[shared])}` on {_line(ctx, chain[shared].home, chain[shared].call)}"
    return text


def through(ctx: FileContext, event: Event) -> str:
    """For the event a finding is about, in a method the function calls: ``(in `m`, run by
    `self.m()` on line 12)``, with its own place first when it is in another module."""
    chain = hops(event)
    if not chain:
        return ""
    where = home(ctx, event)
    at = "" if where is ctx else f"{_line(ctx, where, event.node)}, "
    return (f" ({at}in `{chain[-1].method.name.value}`, run by `{call_text(chain[0])}` on line "
            f"{line_of(ctx, chain[0].call)})")


def evidence(ctx: FileContext, event: Event, what: str | None) -> tuple[Related, ...]:
    """Related locations for an event: the calls that lead to it, and its own place as
    ``what`` (None: not that)."""
    found = [_related(ctx, h.home, h.call, f"`{call_text(h)}` runs `{h.method.name.value}`") for h in hops(event)]
    if what is not None:
        found.append(_related(ctx, home(ctx, event), event.node, what))
    return tuple(found)


def call_text(hop: Hop) -> str:
    return f"self.{hop.method.name.value}({'...' if hop.call.args else ''})"


def _line(ctx: FileContext, where: FileContext, node: cst.CSTNode) -> str:
    """``line 12`` in the analysed file, ``pkg/base.py:12`` in another module."""
    row = line_of(where, node)
    return f"line {row}" if where is ctx else located(ctx, Path(where.path), row, "")[0]


def _related(ctx: FileContext, where: FileContext, node: cst.CSTNode, message: str) -> Related:
    row = line_of(where, node)
    return Related(ctx.path, row, message) if where is ctx else located(ctx, Path(where.path), row, message)[1]


# -- prefilter -----------------------------------------------------------------------------

_LIBRARY_BASES = ("torch.", "abc.", "typing.", "collections.", "enum.")


def class_may_have_together(outline: Outline, *kinds: str | tuple[str, ...]) -> bool:
    """``flow.may_have_together`` for the methods of a class together: whether some class
    may hold an event of each of ``kinds`` (a tuple: one of those) in its methods, or of one
    of them and has a base outside the libraries whose methods may hold the rest."""
    events = flow.events_on_ast(outline)
    functions = [f for kind in (ast.FunctionDef, ast.AsyncFunctionDef) for f in outline.nodes(kind)]
    wanted = [frozenset((k,) if isinstance(k, str) else k) for k in kinds]
    for cls in outline.nodes(ast.ClassDef):
        found = set().union(*(events.get(id(f), ()) for f in functions if contains(cls, f)))
        if all(not found.isdisjoint(k) for k in wanted):
            return True
        if any(not found.isdisjoint(k) for k in wanted) and any(
                not (isinstance(b, ast.Name) and b.id == "object")
                and not any(q.startswith(_LIBRARY_BASES) for q in outline.qualified_names(b)) for b in cls.bases):
            return True
    return False
