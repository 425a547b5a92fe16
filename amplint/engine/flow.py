"""A function's control flow, reduced to the AMP events rules care about, and a forward
analysis over it.

``flow_of(ctx, scope)`` lowers a function (or the module's own code) into blocks of
``Event``s (backward, scaled backward, ``unscale_``, gradient clipping, optimizer and scaler
steps, ``update()``, scaler creation, autocast enter/exit), ``Branch``es on condition
``Atom``s, ``Loop``s, ``Exit``s (return/raise/break/continue) and ``Try``s.

``propagate(flow, analysis)`` pushes a rule's facts forward over that structure. Each state
is a fact plus the atoms assumed on its path, so ``if scaler is not None:`` twice takes the
same branch both times and a branch contradicting an earlier one is never entered. States are
sets merged at every join and capped, so the cost stays linear in the function's size.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Iterator

from .ast_context import AstContext
from .classes import inherited_method
from .outline import child_nodes, first_position
from .regions import autocast_of_with_item, called_function
from .semantics import CLIP_GRAD, GRAD_SCALER, SCALER_PARAMETERS, named_like_optimizer, scaled_backward_scaler
from .summaries import is_backward
from .version_gates import gate_value

BACKWARD = "backward"  # loss.backward(), torch.autograd.backward(...)
SCALED_BACKWARD = "scaled_backward"  # S.scale(loss).backward()
UNSCALE = "unscale_"  # S.unscale_(opt)
CLIP = "clip"  # clip_grad_norm_/clip_grad_value_, or a helper of this file that calls one
STEP = "step"  # opt.step() on something named like an optimizer
SCALER_STEP = "scaler_step"  # S.step(opt)
UPDATE = "update"  # S.update()
SCALER_NEW = "scaler_new"  # S = GradScaler(...)
AUTOCAST_ENTER = "autocast_enter"
AUTOCAST_EXIT = "autocast_exit"

# States kept at one point of the analysis before the atoms on their paths are dropped.
MAX_STATES = 64
# Rounds of a loop's body before its back edge counts as settled.
MAX_LOOP_ROUNDS = 4


@dataclass(frozen=True)
class Event:
    kind: str
    node: ast.AST  # the call (the with item's expression for autocast enter/exit)
    scaler: str | None = None  # canonical text of the GradScaler
    optimizer: str | None = None  # canonical text of the optimizer (S.step/S.unscale_ argument, opt.step receiver)
    via: ast.Call | None = None  # for a helper's CLIP: the clip call inside the helper
    # ... when the helper is another file's (a base class's method): that file (the checked
    # file's own context is not held here: the flows it keeps would make a cycle through it)
    via_module: AstContext | None = None


@dataclass(frozen=True)
class Atom:
    """A condition's normalised text, its version (bumped when a name it reads is assigned),
    and the names it reads (a loop that assigns one of them forgets it on its back edge)."""

    text: str
    version: int
    reads: frozenset[str]


@dataclass
class Branch:
    atom: Atom
    body: list
    orelse: list
    # Whether another branch tests the same atom: only then do paths remember its value (a
    # loop's next iteration may take either branch of one tested once).
    shared: bool = False
    # Whether no branch after this one tests the atom (outside loops): paths forget it here.
    last: bool = False


@dataclass
class Loop:
    node: ast.AST
    body: list
    orelse: list
    assigned: frozenset[str]  # what the body (and the loop's target) assigns


@dataclass
class Exit:
    kind: str  # "return", "raise", "break", "continue"
    node: ast.AST


@dataclass
class Try:
    body: list
    handlers: list[list]
    orelse: list
    final: list


@dataclass
class Flow:
    scope: ast.AST  # a FunctionDef or AsyncFunctionDef, or the Module for module-level code
    block: list
    events: list[Event]  # every event, in source order

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]


def mentions(key: str, names: frozenset[str]) -> bool:
    """Whether ``key`` (``self.opt``, ``opts[i]``) reads one of ``names``, or an attribute of one."""
    for match in re.finditer(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", key):
        parts = match.group().split(".")
        if any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1)):
            return True
    return False


# -- lowering --------------------------------------------------------------------------------

_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def flows(ctx: AstContext) -> list[Flow]:
    """The module's own code and every function in the file, lowered (once per file). A
    function where no call and no ``with`` can make an event is not lowered: its flow has no
    event and an empty block (no AMP step happens in it, whatever its branches)."""
    if "_flows" not in ctx.__dict__:
        functions = [*ctx.outline.nodes(ast.FunctionDef), *ctx.outline.nodes(ast.AsyncFunctionDef)]
        scopes = [ctx.outline.tree, *sorted(functions, key=ctx.order)]
        eventful = _eventful_scopes(ctx)
        ctx.__dict__["_flows"] = [
            _Lowering(ctx, scope).flow() if eventful is None or (id(scope) if i else 0) in eventful
            else Flow(scope, [], []) for i, scope in enumerate(scopes)]
    return ctx.__dict__["_flows"]


# What a call's name must be for ``_Lowering._call_event`` to make an event of it.
_EVENT_METHODS = frozenset({"backward", "unscale_", "step", "update"})
_EVENT_CALLS = frozenset({*GRAD_SCALER, "torch.autograd.backward"})


def _eventful_scopes(ctx: AstContext) -> set[int] | None:
    """The functions (by id, as ``outline.scopes`` keys them: 0 for the module's own code)
    with a ``with`` or a call that may be an event; None for all of them where the file clips
    gradients (a call of any helper of the file may then be a clip)."""
    outline, scopes = ctx.outline, ctx.outline.scopes
    found = {scopes[id(w)] for kind in (ast.With, ast.AsyncWith) for w in outline.nodes(kind)}
    for call in outline.nodes(ast.Call):
        names = outline.qualified_names(call.func)
        if not names.isdisjoint(CLIP_GRAD):
            return None
        if isinstance(call.func, ast.Attribute) and call.func.attr in _EVENT_METHODS \
                or not names.isdisjoint(_EVENT_CALLS):
            found.add(scopes[id(call)])
    return found


def scalers(ctx: AstContext) -> set[str]:
    """Text (``key``) of expressions that hold a GradScaler: targets of ``GradScaler(...)``,
    receivers of ``.scale(loss).backward()`` and of ``unscale_``, and parameters named
    ``scaler``, ``grad_scaler`` or ``amp_scaler``; minus those the file only ever binds to
    another class's instance (a project's own loss scaler with the same method names:
    ``self.scaler = DynamicLossScaler()``)."""
    if "_flow_scalers" not in ctx.__dict__:
        outline = ctx.outline
        found: set[str] = set()
        bindings: dict[str, list[ast.expr]] = {}
        for node in outline.nodes(ast.Assign):
            for target in node.targets:
                bindings.setdefault(key(ctx, target), []).append(node.value)
            if isinstance(node.value, ast.Call) and ctx.resolves_to(node.value.func, GRAD_SCALER):
                found.update(key(ctx, t) for t in node.targets)
        for node in outline.nodes(ast.AnnAssign):
            if isinstance(node.value, ast.Call) and ctx.resolves_to(node.value.func, GRAD_SCALER):
                found.add(key(ctx, node.target))
        found.update(a.arg for a in outline.nodes(ast.arg) if a.arg in SCALER_PARAMETERS)
        for call in outline.nodes(ast.Call):
            scaled = scaled_by(ctx, call)
            if scaled is not None:
                found.add(scaled)
            elif isinstance(call.func, ast.Attribute) and call.func.attr == "unscale_":
                found.add(key(ctx, call.func.value))
        ctx.__dict__["_flow_scalers"] = {s for s in found if not _other_class(ctx, bindings.get(s, []))}
    return ctx.__dict__["_flow_scalers"]


def _other_class(ctx: AstContext, values: list[ast.expr]) -> bool:
    """Every value is ``None`` or an instance of a class other than torch's GradScaler (either
    branch of a conditional expression counted)."""
    leaves: list[ast.expr] = []
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, ast.IfExp):
            stack.extend((value.body, value.orelse))
        elif not (isinstance(value, ast.Constant) and value.value is None):
            leaves.append(value)

    def class_like(func: ast.expr) -> bool:  # a class by its name: `make_scaler()` may return one
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name[:1].isupper()

    return bool(leaves) and all(isinstance(v, ast.Call) and class_like(v.func)
                                and not ctx.resolves_to(v.func, GRAD_SCALER) for v in leaves)


def key(ctx: AstContext, node: ast.AST) -> str:
    """The node's text as a name for what it reads: a condition or a receiver spelled over
    several lines is the same at any indentation."""
    if isinstance(node, ast.Name):  # most of what is asked: its text is its name
        return node.id
    return _CONTINUATION.sub("\n", ctx.code(node))


_CONTINUATION = re.compile(r"\n[ \t]+")


def scaled_by(ctx: AstContext, call: ast.Call) -> str | None:
    """``scaled_backward_scaler`` as ``_key`` spells it."""
    scaled = scaled_backward_scaler(ctx, call)
    return None if scaled is None else _CONTINUATION.sub("\n", scaled)


class _Lowering:
    def __init__(self, ctx: AstContext, scope: ast.AST):
        self.ctx = ctx
        self.scope = scope
        self.scalers = scalers(ctx)
        self.version: dict[str, int] = {}  # text -> the version its last assignment made
        self.counter = 0
        self.aliases: dict[str, str] = {}  # s -> self.scaler after `s = self.scaler`
        self.assigned_stack: list[set[str]] = []
        self.events: list[Event] = []

    def flow(self) -> Flow:
        if isinstance(self.scope, _FUNCTIONS):
            args = self.scope.args
            for param in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if param is not None:
                    self._assign_text(param.arg)
        block = self._block(self.scope.body)
        # Only tests whose branches hold an event or an exit can tell paths apart: remembering
        # the value of another one (`if args.log_every:` twice) only multiplies the states,
        # and past the cap the atoms that keep contradicting paths apart are dropped.
        branches = [b for b in items(block) if isinstance(b, Branch) and _steers(b)]
        counts = Counter(b.atom for b in branches)
        in_loops = {id(b) for loop in items(block) if isinstance(loop, Loop) for b in items(loop.body)}
        last = {b.atom: b for b in branches}
        for branch in branches:
            branch.shared = counts[branch.atom] > 1
            branch.last = branch.shared and last[branch.atom] is branch and id(branch) not in in_loops
        return Flow(self.scope, block, sorted(self.events, key=lambda e: self.ctx.order(e.node)))

    # -- statements

    def _block(self, statements: list[ast.stmt]) -> list:
        out: list = []
        for statement in statements:
            out.extend(self._statement(statement))
        return out

    def _statement(self, node: ast.stmt) -> list:
        if isinstance(node, ast.If):
            return self._events_in(node.test) + self._condition(node.test, self._block(node.body),
                                                                self._block(node.orelse))
        if isinstance(node, (ast.For, ast.AsyncFor)):
            head = self._events_in(node.iter)
            self.assigned_stack.append(set())
            self._assign(node.target)
            return head + [self._loop(node, self._block(node.body))]
        if isinstance(node, ast.While):
            self.assigned_stack.append(set())
            return [self._loop(node, self._events_in(node.test) + self._block(node.body))]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self._with(node)
        if isinstance(node, (ast.Try, ast.TryStar)):
            body = self._block(node.body)
            handlers = []
            for handler in node.handlers:
                if handler.name is not None:
                    self._assign_text(handler.name)
                handlers.append(self._block(handler.body))
            return [Try(body, handlers, self._block(node.orelse), self._block(node.finalbody))]
        if isinstance(node, ast.Match):
            return self._events_in(node.subject) + self._match(node.cases)
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            self._assign_text(node.name)
            return []
        return self._small(node)

    def _loop(self, node: ast.stmt, body: list) -> Loop:
        assigned = self.assigned_stack.pop()
        if self.assigned_stack:  # an inner loop's assignments are the outer loop's too
            self.assigned_stack[-1].update(assigned)
        return Loop(node, body, self._block(node.orelse), frozenset(assigned))

    def _match(self, cases: list[ast.match_case]) -> list:
        if not cases:
            return []
        case = cases[0]
        # Cases are told apart by their own atoms: no two are ever correlated.
        atom = Atom(f"<case {self.ctx.order(case.pattern)}>", 0, frozenset())
        return [Branch(atom, self._block(case.body), self._match(cases[1:]))]

    def _with(self, node: ast.With | ast.AsyncWith) -> list:
        out: list = []
        regions = []
        for item in node.items:
            out.extend(self._events_in(item.context_expr))
            if autocast_of_with_item(self.ctx, item) is not None:
                regions.append(self._event(Event(AUTOCAST_ENTER, item.context_expr)))
            if item.optional_vars is not None:
                self._assign(item.optional_vars)
        out.extend(regions)
        out.extend(self._block(node.body))
        # Only the normal way out is modelled; a return inside the region skips the exit event.
        out.extend(self._event(Event(AUTOCAST_EXIT, r.node)) for r in reversed(regions))
        return out

    def _small(self, node: ast.stmt) -> list:
        if isinstance(node, ast.Break):
            return [Exit("break", node)]
        if isinstance(node, ast.Continue):
            return [Exit("continue", node)]
        out = self._events_in(node)
        if isinstance(node, ast.Return):
            out.append(Exit("return", node))
        elif isinstance(node, ast.Raise):
            out.append(Exit("raise", node))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self._assign(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            self._assign(node.target)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    self._assign_text((alias.asname or alias.name).split(".")[0])
        return out

    # -- assignments, aliases, versions

    def _assign(self, target: ast.expr, value: ast.expr | None = None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assign(element)
            return
        if isinstance(target, ast.Starred):
            self._assign(target.value)
            return
        text = key(self.ctx, target)
        self._assign_text(text)
        if isinstance(target, ast.Name) and isinstance(value, (ast.Attribute, ast.Name)):
            self.aliases[text] = self.canonical(value)

    def _assign_text(self, text: str) -> None:
        self.counter += 1
        self.version[text] = self.counter
        self.aliases.pop(text, None)
        # (a target that does not spell ``text`` at all cannot mention it)
        for stale in [a for a, target in self.aliases.items()
                      if text in target and mentions(target, frozenset({text}))]:
            del self.aliases[stale]
        if self.assigned_stack:
            self.assigned_stack[-1].add(text)

    def canonical(self, expr: ast.expr) -> str:
        text = key(self.ctx, expr)
        return self.aliases.get(text, text)

    # -- conditions

    def _condition(self, test: ast.expr, then: list, orelse: list) -> list:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._condition(test.operand, orelse, then)
        if isinstance(test, ast.BoolOp):
            first, rest = test.values[0], test.values[1:]
            second = rest[0] if len(rest) == 1 else ast.BoolOp(test.op, rest)
            if isinstance(test.op, ast.And):
                return self._condition(first, self._condition(second, then, orelse), orelse)
            return self._condition(first, then, self._condition(second, then, orelse))
        gate = gate_value(self.ctx, test)  # a torch-version condition: one branch never runs
        if gate is not None:
            return then if gate else orelse
        subject, positive = _truth_subject(test)
        if not positive:
            then, orelse = orelse, then
        return [Branch(self._atom(subject), then, orelse)]

    def _atom(self, expr: ast.expr) -> Atom:
        text = key(self.ctx, expr)
        if text in self.aliases:  # `s` after `s = self.scaler` reads `self.scaler`
            text = self.aliases[text]
            parts = text.split(".")
            reads = frozenset(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        else:
            reads = frozenset(self._reads(expr))
        return Atom(text, max((self.version.get(r, 0) for r in reads), default=0), reads)

    def _reads(self, expr: ast.expr) -> Iterator[str]:
        """The names and attribute chains an expression reads (``self.amp`` and ``self``)."""
        stack = [expr]
        while stack:
            current = stack.pop()
            if isinstance(current, (ast.Name, ast.Attribute)):
                yield key(self.ctx, current)
            if isinstance(current, ast.Attribute):
                stack.append(current.value)
            else:
                stack.extend(c for c in child_nodes(current) if not isinstance(c, _NESTED))

    # -- events

    def _events_in(self, node: ast.AST) -> list:
        """The events of the calls in ``node``, a simple statement or an expression."""
        return [e for call in calls_in(self.ctx, node) if (e := self._call_event(call)) is not None]

    def _event(self, event: Event) -> Event:
        self.events.append(event)
        return event

    def _call_event(self, call: ast.Call) -> Event | None:
        ctx = self.ctx
        scaled = scaled_by(ctx, call)
        if scaled is not None and (scaled in self.scalers or self.aliases.get(scaled) in self.scalers):
            return self._event(Event(SCALED_BACKWARD, call, self.aliases.get(scaled, scaled)))
        if is_backward(ctx.outline, call):
            return self._event(Event(BACKWARD, call))
        if isinstance(call.func, ast.Attribute):
            receiver, method = call.func.value, call.func.attr
            is_scaler = key(ctx, receiver) in self.scalers or self.canonical(receiver) in self.scalers
            if is_scaler and method in ("unscale_", "step", "update"):
                kind = {"unscale_": UNSCALE, "step": SCALER_STEP, "update": UPDATE}[method]
                first = call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else None
                optimizer = self.canonical(first) if first is not None and kind != UPDATE else None
                return self._event(Event(kind, call, self.canonical(receiver), optimizer))
            if method == "step" and not call.args and not call.keywords and not is_scaler \
                    and named_like_optimizer(key(ctx, receiver)):
                return self._event(Event(STEP, call, None, self.canonical(receiver)))
        if ctx.resolves_to(call.func, CLIP_GRAD):
            return self._event(Event(CLIP, call))
        inner = self._helper_clip(call)
        if inner is not None:
            return self._event(Event(CLIP, call, via=inner[0], via_module=inner[1]))
        if ctx.resolves_to(call.func, GRAD_SCALER):
            parent = ctx.parent(call)
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
                return self._event(Event(SCALER_NEW, call, key(ctx, parent.targets[0])))
        return None

    def _helper_clip(self, call: ast.Call) -> tuple[ast.Call, AstContext | None] | None:
        """The clip inside a helper that ``call`` runs (``helper``, a function of this file; a
        method of the class or of a base, ``self.helper``), whose own body clips gradients and
        never unscales them; with the helper's file when it is another."""
        helper, other = called_function(self.ctx, call), None
        if helper is None:
            inherited = inherited_method(self.ctx, call)
            if inherited is None:
                return None
            other, helper = inherited
            other = other if other is not self.ctx else None
        where = other or self.ctx
        # Once per helper, not once per call of it; the helper is held beside its answer, as
        # one of another file may outlive that file's kept context.
        cache = self.ctx.__dict__.setdefault("_helper_clips", {})
        if id(helper) not in cache:
            clips, stack = [], [s for s in helper.body if not isinstance(s, _NESTED)]
            while stack:
                node = stack.pop()
                if isinstance(node, ast.Call):
                    if isinstance(node.func, ast.Attribute) and node.func.attr == "unscale_":
                        clips = []
                        break
                    if where.resolves_to(node.func, CLIP_GRAD):
                        clips.append(node)
                stack.extend(c for c in child_nodes(node) if not isinstance(c, _NESTED))
            cache[id(helper)] = helper, ((min(clips, key=where.order), other) if clips else None)
        return cache[id(helper)][1]


def calls_in(ctx: AstContext, node: ast.AST) -> list[ast.Call]:
    """The calls in ``node`` (a statement or an expression) in source order, less those in
    nested functions, classes and lambdas (theirs). For a statement, from the file's call
    index: the calls that start and end inside it, less those inside a definition or lambda
    that lies inside it. An expression is walked: one inside an f-string has the whole
    string's place, and a definition's own code is what is asked of it."""
    if not isinstance(node, ast.stmt) or isinstance(node, _NESTED):
        calls, stack = [], [node]
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Call):
                calls.append(current)
            stack.extend(c for c in child_nodes(current) if not isinstance(c, _NESTED))
        return sorted(calls, key=ctx.order)
    ordered, starts = ctx.calls_in_order
    start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
    found = [c for c in ordered[bisect.bisect_left(starts, start):bisect.bisect_right(starts, end)]
             if (c.end_lineno, c.end_col_offset) <= end]
    spans, span_starts = _nested_spans(ctx)
    nested = [(s, e) for s, e in spans[bisect.bisect_left(span_starts, start):bisect.bisect_right(span_starts, end)]
              if e <= end]
    if found and nested:
        found = [c for c in found if not any(s <= (c.lineno, c.col_offset) and (c.end_lineno, c.end_col_offset) <= e
                                             for s, e in nested)]
    return found


def _nested_spans(ctx: AstContext) -> tuple[list[tuple[tuple[int, int], tuple[int, int]]], list[tuple[int, int]]]:
    """Where each function, class and lambda of the file lies (from its first decorator), in
    source order, and where each starts."""
    if "_nested_spans" not in ctx.__dict__:
        spans = sorted((first_position(n), (n.end_lineno, n.end_col_offset))
                       for kind in _NESTED for n in ctx.outline.nodes(kind))
        ctx.__dict__["_nested_spans"] = spans, [s for s, _ in spans]
    return ctx.__dict__["_nested_spans"]


def _truth_subject(test: ast.expr) -> tuple[ast.expr, bool]:
    """``x is not None``, ``x != None``, ``bool(x)`` and ``x`` test one thing, ``x``; ``x is None``
    its negation."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        comparator = test.comparators[0]
        if isinstance(comparator, ast.Constant) and comparator.value is None:
            if isinstance(test.ops[0], (ast.IsNot, ast.NotEq)):
                return _truth_subject(test.left)
            if isinstance(test.ops[0], (ast.Is, ast.Eq)):
                subject, positive = _truth_subject(test.left)
                return subject, not positive
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "bool" \
            and len(test.args) == 1 and not test.keywords and not isinstance(test.args[0], ast.Starred):
        return _truth_subject(test.args[0])
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        subject, positive = _truth_subject(test.operand)
        return subject, not positive
    return test, True


def _steers(branch: Branch) -> bool:
    """Whether a side of the branch holds an event or an exit: what a path's facts depend on."""
    return any(isinstance(item, (Event, Exit)) for item in items(branch.body + branch.orelse))


def items(block: list) -> Iterator:
    """Every item of a block, nested ones included."""
    for item in block:
        yield item
        if isinstance(item, Branch):
            yield from items(item.body)
            yield from items(item.orelse)
        elif isinstance(item, Loop):
            yield from items(item.body)
            yield from items(item.orelse)
        elif isinstance(item, Try):
            for part in (item.body, *item.handlers, item.orelse, item.final):
                yield from items(part)


# -- analysis ---------------------------------------------------------------------------------

Fact = Hashable


class Analysis:
    """A rule's forward analysis: its facts are hashable values; ``event`` moves one over an
    event (and may record what the rule finds there)."""

    # Whether a loop's end flows back to its start (questions about the next iteration).
    back_edges = False

    def start(self) -> Fact:
        raise NotImplementedError

    def event(self, fact: Fact, event: Event) -> Fact:
        raise NotImplementedError

    def loop_entry(self, fact: Fact, loop: Loop) -> Fact:
        """The fact at the start of each iteration of ``loop``."""
        return fact

    def forget(self, fact: Fact, names: frozenset[str]) -> Fact:
        """The fact carried over a back edge, minus what the loop's assignments made stale."""
        return fact


@dataclass
class Outcome:
    fall: set = field(default_factory=set)
    exits: dict[str, set] = field(default_factory=lambda: {k: set() for k in ("return", "raise", "break", "continue")})

    def absorb(self, other: "Outcome", *, fall: bool = True) -> None:
        if fall:
            self.fall |= other.fall
        for kind, states in other.exits.items():
            self.exits[kind] |= states


def propagate(flow: Flow, analysis: Analysis) -> set:
    """Run ``analysis`` over ``flow`` from its start; the facts at the function's normal ends
    (falling off its end or returning)."""
    out = _run(flow.block, {(analysis.start(), frozenset())}, analysis, None)
    return {fact for fact, _ in out.fall | out.exits["return"]}


def _cap(states: set) -> set:
    """Over the cap, paths forget atoms one at a time, each time the one whose loss merges the
    most states, until they fit (the facts' own domain is small: sets of scalers, optimizers
    and calls of one function). An atom forgotten lets a path take both sides of its later
    tests: those that merge the most states are the conditions least tied to the facts."""
    while len(states) > MAX_STATES:
        # In a fixed order, so that ties go the same way in every run.
        conditions = sorted({atom for _, atoms in states for atom, _ in atoms}, key=lambda a: (a.text, a.version))
        if not conditions:
            break
        # How many states forgetting each atom leaves, counted without building every
        # candidate set: only the states on the atom change, and each merges with another so
        # changed or with a state that was already without the atom.
        holding: dict[Atom, list] = {}
        for state in states:
            for atom in {atom for atom, _ in state[1]}:
                holding.setdefault(atom, []).append(state)

        def left(dropped: Atom) -> int:
            sides = _sides(dropped)
            changed = {(fact, atoms - sides) for fact, atoms in holding[dropped]}
            return len(states) - len(holding[dropped]) + sum(state not in states for state in changed)

        sides = _sides(min(conditions, key=left))  # the first of those that leave the fewest
        states = {(fact, atoms - sides) for fact, atoms in states}
    return states


def _sides(atom: Atom) -> frozenset:
    """What a path may assume of ``atom``: either of its values."""
    return frozenset({(atom, True), (atom, False)})


def _run(block: list, states: set, analysis: Analysis, trace: list | None) -> Outcome:
    out = Outcome()
    for item in block:
        if not states:
            break
        if trace is not None:
            trace.append(states)
        if isinstance(item, Event):
            states = {(analysis.event(fact, item), atoms) for fact, atoms in states}
        elif isinstance(item, Exit):
            out.exits[item.kind] |= states
            states = set()
        elif isinstance(item, Branch):
            states = _branch(item, states, analysis, trace, out)
        elif isinstance(item, Loop):
            states = _loop(item, states, analysis, trace, out)
        elif isinstance(item, Try):
            states = _try(item, states, analysis, trace, out)
        states = _cap(states)
    out.fall |= states
    return out


def _branch(item: Branch, states: set, analysis: Analysis, trace, out: Outcome) -> set:
    if not item.shared:
        then = orelse = states
    else:
        then, orelse = set(), set()
        for fact, atoms in states:
            if (item.atom, False) not in atoms:
                then.add((fact, atoms | {(item.atom, True)}))
            if (item.atom, True) not in atoms:
                orelse.add((fact, atoms | {(item.atom, False)}))
    first = _run(item.body, then, analysis, trace)
    second = _run(item.orelse, orelse, analysis, trace)
    out.absorb(first, fall=False)
    out.absorb(second, fall=False)
    if item.last:
        return {(fact, atoms - {(item.atom, True), (item.atom, False)}) for fact, atoms in first.fall | second.fall}
    return first.fall | second.fall


def _loop(item: Loop, states: set, analysis: Analysis, trace, out: Outcome) -> set:
    head = {(analysis.loop_entry(fact, item), atoms) for fact, atoms in states}
    body = _run(item.body, head, analysis, trace)
    rounds = 1
    while analysis.back_edges and rounds < MAX_LOOP_ROUNDS:
        back = {(analysis.loop_entry(analysis.forget(fact, item.assigned), item),
                 frozenset(a for a in atoms if not (a[0].reads & item.assigned)))
                for fact, atoms in body.fall | body.exits["continue"]}
        grown = _cap(head | back)
        if grown == head:
            break
        head = grown
        body = _run(item.body, head, analysis, trace)
        rounds += 1
    # How a loop ends: a `for` is taken to run at least once, and a `continue` that skips the
    # rest of the body to filter items (`if i != k: continue`) to let some item through, so
    # its states end the loop only where no path runs the whole body.
    ended = body.fall or body.exits["continue"]
    if isinstance(item.node, ast.While):
        ended = ended | states
    orelse = _run(item.orelse, ended, analysis, trace)
    out.exits["return"] |= body.exits["return"] | orelse.exits["return"]
    out.exits["raise"] |= body.exits["raise"] | orelse.exits["raise"]
    out.exits["break"] |= orelse.exits["break"]
    out.exits["continue"] |= orelse.exits["continue"]
    return orelse.fall | body.exits["break"]


def _try(item: Try, states: set, analysis: Analysis, trace, out: Outcome) -> set:
    seen: list = []
    body = _run(item.body, states, analysis, seen)
    if trace is not None:
        trace.extend(seen)
    outcome = Outcome()
    outcome.absorb(_run(item.orelse, body.fall, analysis, trace))
    outcome.exits["return"] |= body.exits["return"]
    outcome.exits["break"] |= body.exits["break"]
    outcome.exits["continue"] |= body.exits["continue"]
    if item.handlers:
        # Any point of the body may raise into a handler.
        raised = _cap(set().union(*seen, body.fall, body.exits["raise"]) if seen else set(states))
        for handler in item.handlers:
            outcome.absorb(_run(handler, raised, analysis, trace))
    else:
        outcome.exits["raise"] |= body.exits["raise"]
    if not item.final:
        out.absorb(outcome, fall=False)
        return outcome.fall
    # The finally block runs on every way out, which it then continues.
    final = _run(item.final, outcome.fall, analysis, trace)
    out.absorb(final, fall=False)
    for kind, pending in outcome.exits.items():
        if pending:
            through = _run(item.final, pending, analysis, trace)
            out.absorb(through, fall=False)
            out.exits[kind] |= through.fall
    return final.fall


def line_of(ctx: AstContext, node: ast.AST) -> int:
    """The 1-based line where ``node`` starts (for messages that name another place)."""
    return ctx.location(ctx.offsets(node)[0]).row
