"""A function's flow (``flow.flows``' events and structure) with the methods it calls on
``self`` inlined: ``self._optimizer_step()`` stands for the body of ``_optimizer_step``, so a
trainer that scales the loss in one method, steps in a second and updates in a third is one
iteration to a rule. Only a method of a class that itself backpropagates, steps, updates or
unscales is followed, and only where it and its own class's methods reach a backward and a
step or update (or one of them, with the rest left to a base): the bases are read then.

A method is found as Python finds it on an instance of the function's class
(``classes.lookup_order``). A callee's ``return`` continues after the call; its ``raise`` leaves
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

from . import flow
from .ast_context import AstContext
from .classes import is_object, lookup_order
from .crossfile import located
from .diagnostics import Related
from .flow import Event, Exit, Flow, Loop, line_of
from .outline import child_nodes
from .regions import bind, called_function

MAX_DEPTH = 3  # calls followed from the analysed function
RETURN = "return"

# Method names whose calls may make an event (a scaler's or an optimizer's, a backward): a
# method calling none of them, directly or through ``self``, is not followed.
_EVENT_METHODS = frozenset({"backward", "step", "update", "unscale_"})
_SCALER_STATE = frozenset({"step", "unscale_", "update"})  # what records or clears inf checks
_SPELLED = (ast.Name, ast.Attribute)  # arguments a callee's parameter may stand for
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED = (*_FUNCTIONS, ast.ClassDef, ast.Lambda)

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Hop:
    call: ast.Call  # ``self.m(...)``
    home: AstContext  # the module the call is in
    method: Function  # ``m``
    method_home: AstContext  # the module ``m`` is in


@dataclass(frozen=True)
class Reached(Event):
    hops: tuple[Hop, ...] = ()


def home(ctx: AstContext, event: Event) -> AstContext:
    """The module ``event``'s node is in (``ctx``: the analysed file)."""
    return event.hops[-1].method_home if isinstance(event, Reached) else ctx


def hops(event: Event) -> tuple[Hop, ...]:
    return event.hops if isinstance(event, Reached) else ()


def site(ctx: AstContext, event: Event) -> ast.AST:
    """Where a finding about ``event`` sits in the analysed file: its own node, or, for an
    event of another module, the call in this file that leads there."""
    if home(ctx, event) is ctx:
        return event.node
    return next(h.call for h in reversed(event.hops) if h.home is ctx)


def order(ctx: AstContext, event: Event) -> tuple:
    """The order in which one flow's events run: by the calls that lead to them, then by their
    own place."""
    return (*(h.home.order(h.call) for h in hops(event)), home(ctx, event).order(event.node))


@dataclass
class MethodFlow:
    flow: Flow
    function: Function | None
    # The loops that stand for inlined calls (by id), and the call each runs.
    wrappers: dict[int, Hop]
    # The calls of the function and its inlined methods that make no event and were not
    # inlined, with the module each is in and the lowering that met it (None: not inlining).
    opaque: list[tuple[ast.Call, AstContext, "_Inlining | None"]]

    def parameters(self) -> frozenset[str]:
        """The function's parameters but the instance's (``self``, ``cls``)."""
        if self.function is None:
            return frozenset()
        return frozenset(_params(self.function)) - {"self", "cls"}

    def hides(self, scaler: str) -> bool:
        """Whether the code may step, unscale or update ``scaler`` where the flow does not show
        it: it passes the scaler to a call (nerfstudio's ``optimizer_scaler_step_some(
        self.grad_scaler, ...)``), or calls a method of the class left out (too deep, a return
        in a loop) or a function of its module that steps, unscales or updates it."""
        for call, where, lowering in self.opaque:
            if lowering is not None and lowering.touches(call):
                return True
            if any((lowering.canonical(a) if lowering is not None and isinstance(a, _SPELLED)
                    else flow.key(where, a)) == scaler for a in _arguments(call)):
                return True
            helper = called_function(where, call)
            if helper is not None and any(isinstance(c.func, ast.Attribute) and c.func.attr in _SCALER_STATE
                                          and flow.key(where, c.func.value) == scaler
                                          for c in where.calls_within(helper)):
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


def method_flows(ctx: AstContext) -> list[MethodFlow]:
    """The module's own code and every function of the file that makes an event or calls a
    method of ``self``, lowered with those calls inlined."""
    found = []
    hierarchies: dict[int, _Hierarchy] = {}  # by id of the class
    by_function: dict[int, list[ast.Call]] | None = None  # the file's calls by the function they are in
    for lowered in flow.flows(ctx):
        scope = lowered.scope
        function = scope if isinstance(scope, _FUNCTIONS) else None
        cls = ctx.enclosing(scope, ast.ClassDef) if function is not None else None
        hierarchy = None
        if cls is not None and _may_make_events(ctx, cls):
            if id(cls) not in hierarchies:
                hierarchies[id(cls)] = _Hierarchy(ctx, cls)
            hierarchy = hierarchies[id(cls)]
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
            if by_function is None:
                by_function = {}
                for call in ctx.outline.nodes(ast.Call):
                    by_function.setdefault(id(ctx.enclosing_function(call)), []).append(call)
            # (the call that opens an autocast region makes no event of its own: it stays a call)
            made = {id(e.node) for e in lowered.events if e.kind not in (flow.AUTOCAST_ENTER, flow.AUTOCAST_EXIT)}
            opaque = [(c, ctx, None) for c in by_function.get(id(function), []) if id(c) not in made]
            found.append(MethodFlow(Flow(scope, block, events), function, {}, opaque))
    # Neither they nor the hierarchies are kept on the context: they refer to it, and a cycle
    # through the context would keep the whole tree alive past the check (AMP006 asks once per file).
    return found


def _worth_following(hierarchy: "_Hierarchy", ctx: AstContext, function: Function, cls: ast.ClassDef) -> bool:
    """Whether following the function's calls may give it both halves of an iteration, a
    backward and a step or update: by what it and the methods of its own class call, the rest
    left to the bases (read only then)."""
    names = hierarchy.reaches(ctx, function, own=True)
    halves = ("backward" in names) + (not names.isdisjoint({"step", "update"}))
    return halves == 2 or halves == 1 and any(not is_object(base) for base in cls.bases)


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

    def __init__(self, ctx: AstContext, cls: ast.ClassDef):
        self.classes: list[tuple[AstContext, ast.ClassDef]] = []  # those read so far
        self.own = cls
        # Not a generator of this object's: its frame would hold the object, a cycle that keeps
        # the check's context alive past the check, for the cycle collector to walk.
        self._unread = lookup_order(ctx, cls)
        self._reaches: dict[tuple[int, bool], frozenset[str]] = {}
        self._methods: dict[str, tuple[AstContext, Function] | None] = {}
        # What the file sets on ``self``: attributes (``self.model(x)``), not methods.
        self.attributes = {text[5:] for a in ctx.outline.nodes(ast.Assign) for t in a.targets
                           if (text := ctx.code(t)).startswith("self.")}

    def method(self, name: str, own: bool = False) -> tuple[AstContext, Function] | None:
        """The method ``self.name`` runs, if it is a plain one the hierarchy defines (``own``:
        the class itself, its bases left unread)."""
        if own and not any(isinstance(s, _FUNCTIONS) and s.name == name for s in self.own.body):
            return None
        if name not in self._methods:
            self._methods[name] = None if name in self.attributes else self._lookup(name)
        return self._methods[name]

    def _lookup(self, name: str) -> tuple[AstContext, Function] | None:
        index = 0
        while True:
            if index == len(self.classes):
                found = next(self._unread, None)
                if found is None:
                    return None
                self.classes.append(found)
            where, cls = self.classes[index]
            defined = [s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == name]
            if defined:
                return (where, defined[-1]) if _followable(where, defined[-1]) else None
            index += 1

    def relevant(self, where: AstContext, method: Function) -> bool:
        """Whether ``method`` calls something that may make an event, itself or through a
        method of ``self``."""
        return bool(self.reaches(where, method))

    def reaches(self, where: AstContext, code: ast.AST, own: bool = False, depth: int = 0) -> frozenset[str]:
        """The methods that may make an event (``_EVENT_METHODS``) that ``code`` calls, itself
        or through methods of ``self`` ``MAX_DEPTH`` deep (``own``: of the class itself)."""
        key = (id(code), own)
        if key not in self._reaches:
            self._reaches[key] = frozenset()  # a method calling itself adds nothing
            found: set[str] = set()
            for call in where.calls_within(code):
                name = _self_method(call)
                target = self.method(name, own) if name is not None and depth < MAX_DEPTH else None
                if target is not None:
                    found |= self.reaches(*target, own, depth + 1)
                elif isinstance(call.func, ast.Attribute) and call.func.attr in _EVENT_METHODS:
                    found.add(call.func.attr)
            self._reaches[key] = frozenset(found)
        return self._reaches[key]


def _may_make_events(ctx: AstContext, cls: ast.ClassDef) -> bool:
    """Whether the class itself calls something that may make an event: the methods of one
    that never does are not followed (into its bases either)."""
    cache = ctx.__dict__.setdefault("_classes_making_events", {})
    if id(cls) not in cache:
        cache[id(cls)] = any(isinstance(c.func, ast.Attribute) and c.func.attr in _EVENT_METHODS
                             for c in ctx.calls_within(cls))
    return cache[id(cls)]


def _followable(ctx: AstContext, method: Function) -> bool:
    """A plain method: not a coroutine, a generator, or a property (``self.m()`` then runs
    something else than its body)."""
    if isinstance(method, ast.AsyncFunctionDef) or _decorated(ctx, method, "property", "cached_property"):
        return False
    stack: list[ast.AST] = list(method.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return False
        stack.extend(c for c in child_nodes(node) if not isinstance(c, _NESTED))
    return True


def _decorated(ctx: AstContext, method: Function, *names: str) -> bool:
    return any(ctx.code(d).split(".")[-1] in names for d in method.decorator_list)


def _self_method(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return None


def _params(function: Function) -> list[str]:
    """The function's parameters, in order (``*args`` and ``**kwargs`` last)."""
    args = function.args
    return [p.arg for p in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if p is not None]


def _arguments(call: ast.Call) -> list[ast.expr]:
    """What a call passes: its arguments, ``*args``' and ``**kwargs``' values included."""
    return [*(a.value if isinstance(a, ast.Starred) else a for a in call.args), *(k.value for k in call.keywords)]


# -- lowering ------------------------------------------------------------------------------

_ROOT = re.compile(r"[A-Za-z_]\w*")


class _Inlining(flow._Lowering):
    def __init__(self, ctx: AstContext, scope: ast.AST, hierarchy: _Hierarchy | None, hops_: tuple[Hop, ...]):
        super().__init__(ctx, scope)
        self.hierarchy = hierarchy
        self.hops = hops_
        self.bound: dict[str, str] = {}  # a callee's parameters: how the caller spells their arguments
        self.reached: list[Event] = []  # events of inlined methods
        self.opaque: list[tuple[ast.Call, AstContext, _Inlining | None]] = []
        self.wrappers: dict[int, Hop] = {}

    def spelled(self, text: str) -> str:
        """``text`` as the caller spells it, where it reads a parameter of the callee."""
        match = _ROOT.match(text)
        if match is None or match.group() not in self.bound:
            return text
        return self.bound[match.group()] + text[match.end():]

    def canonical(self, expr: ast.expr) -> str:
        text = flow.key(self.ctx, expr)
        return self.aliases[text] if text in self.aliases else self.spelled(text)

    def _assign_text(self, text: str) -> None:
        super()._assign_text(text)
        self.bound.pop(text, None)  # the parameter now holds something else

    def _event(self, event: Event) -> Event:
        if event.kind == flow.SCALED_BACKWARD:
            raw = flow.scaled_by(self.ctx, event.node)
            event = replace(event, scaler=self.aliases.get(raw) or self.spelled(raw))
        if self.hops:
            event = Reached(**{f.name: getattr(event, f.name) for f in fields(Event)}, hops=self.hops)
        return super()._event(event)

    def _small(self, node: ast.stmt) -> list:
        out = super()._small(node)
        if isinstance(node, ast.Return):
            out.insert(len(out) - 1, self._event(Event(RETURN, node)))
        return out

    def _events_in(self, node: ast.AST) -> list:
        out: list = []
        for call in flow.calls_in(self.ctx, node):
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

    def touches(self, call: ast.Call) -> bool:
        """Whether a call left out runs a method of ``self`` that may make an event."""
        name = _self_method(call)
        target = self.hierarchy.method(name) if name is not None and self.hierarchy is not None else None
        return target is not None and self.hierarchy.relevant(*target)

    def _inline(self, call: ast.Call) -> Loop | None:
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
        params = _params(method)
        arguments = bind(call, params if _decorated(where, method, "staticmethod") else params[1:])
        if arguments is None:
            return None
        hop = Hop(call, self.ctx, method, where)
        callee = _Inlining(where, method, self.hierarchy, self.hops + (hop,))
        callee.counter = self.counter  # versions of the callee's atoms stay apart from the caller's
        callee.assigned_stack.append(set())
        for param in params:
            callee._assign_text(param)
        callee.bound = {name: self.canonical(arg) for name, arg in arguments.items()
                        if not (isinstance(arg, ast.Constant) and (arg.value is None or isinstance(arg.value, bool)))}
        # `self` is the same object: the caller's scalers on it are the callee's too
        callee.scalers = callee.scalers | {text for text in callee.bound.values() if text in self.scalers} \
            | {text for text in self.scalers if text.startswith("self.")}
        block = _returns_as_breaks(callee._block(method.body))
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

def place(ctx: AstContext, event: Event, seen: tuple[Hop, ...] = ()) -> str:
    """How a message names where an event is: its line, and for an event of a method the
    function calls, the method and the first call leading there that the message has not
    named yet (``seen``: the calls that lead to what the finding is about)."""
    chain = hops(event)
    text = _line(ctx, home(ctx, event), event.node)
    if chain:
        text += f" in `{chain[-1].method.name}`"
        shared = next((i for i, (a, b) in enumerate(zip(chain, seen)) if a != b), min(len(chain), len(seen)))
        if shared < len(chain):
            text += f", run by `{call_text(chain[shared])}` on {_line(ctx, chain[shared].home, chain[shared].call)}"
    return text


def through(ctx: AstContext, event: Event) -> str:
    """For the event a finding is about, in a method the function calls: ``(in `m`, run by
    `self.m()` on line 12)``, with its own place first when it is in another module."""
    chain = hops(event)
    if not chain:
        return ""
    where = home(ctx, event)
    at = "" if where is ctx else f"{_line(ctx, where, event.node)}, "
    return (f" ({at}in `{chain[-1].method.name}`, run by `{call_text(chain[0])}` on line "
            f"{line_of(ctx, chain[0].call)})")


def evidence(ctx: AstContext, event: Event, what: str | None) -> tuple[Related, ...]:
    """Related locations for an event: the calls that lead to it, and its own place as
    ``what`` (None: not that)."""
    found = [_related(ctx, h.home, h.call, f"`{call_text(h)}` runs `{h.method.name}`") for h in hops(event)]
    if what is not None:
        found.append(_related(ctx, home(ctx, event), event.node, what))
    return tuple(found)


def call_text(hop: Hop) -> str:
    return f"self.{hop.method.name}({'...' if hop.call.args or hop.call.keywords else ''})"


def _line(ctx: AstContext, where: AstContext, node: ast.AST) -> str:
    """``line 12`` in the analysed file, ``pkg/base.py:12`` in another module."""
    row = line_of(where, node)
    return f"line {row}" if where is ctx else located(ctx, Path(where.path), row, "")[0]


def _related(ctx: AstContext, where: AstContext, node: ast.AST, message: str) -> Related:
    row = line_of(where, node)
    return Related(ctx.path, row, message) if where is ctx else located(ctx, Path(where.path), row, message)[1]
