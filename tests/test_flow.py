"""The flow model (amplint/engine/flow.py) on real parses: events, condition atoms, exits,
loops and try, and what a forward analysis sees over them."""

import ast
import textwrap

from amplint.engine import flow
from amplint.engine.ast_context import AstContext
from amplint.engine.outline import Outline
from amplint.policy import loader


def _flows(source: str) -> tuple[AstContext, dict[str, flow.Flow]]:
    source = textwrap.dedent(source)
    ctx = AstContext("example.py", source, Outline.parse(source), loader("cuda"))
    named = {getattr(f.scope, "name", "<module>"): f for f in flow.flows(ctx)}
    return ctx, named


def _branches(block: list) -> list[flow.Branch]:
    return [item for item in flow.items(block) if isinstance(item, flow.Branch)]


def _kinds(block: list) -> list[str]:
    return [item.kind for item in block if isinstance(item, flow.Event)]


class _Sequences(flow.Analysis):
    """The fact: the kinds of the events on the path so far (the last four)."""

    def __init__(self, back_edges: bool = False):
        self.back_edges = back_edges
        self.at: dict[str, set[tuple]] = {}  # event kind -> the facts it was reached with

    def start(self):
        return ()

    def event(self, fact, event):
        self.at.setdefault(event.kind, set()).add(fact)
        return (fact + (event.kind,))[-4:]


def _ends(source: str, name: str, back_edges: bool = False) -> tuple[set, _Sequences]:
    _, flows = _flows(source)
    analysis = _Sequences(back_edges)
    return flow.propagate(flows[name], analysis), analysis


def test_one_atom_for_each_spelling_of_a_truth_test():
    _, flows = _flows("""
        def f(scaler, loss, opt):
            if scaler is not None:
                scaler.scale(loss).backward()
            if scaler:
                scaler.unscale_(opt)
            if not scaler is None:
                scaler.step(opt)
            if bool(scaler):
                scaler.update()
            if scaler is None:
                loss.backward()
    """)
    branches = _branches(flows["f"].block)
    assert {b.atom for b in branches} == {branches[0].atom}
    assert branches[0].atom.text == "scaler"
    assert all(b.shared for b in branches)
    # `scaler is None` is the negation: its body is the atom's false branch.
    assert _kinds(branches[-1].body) == [] and _kinds(branches[-1].orelse) == ["backward"]
    assert _kinds(branches[0].body) == ["scaled_backward"]


def test_reassignment_makes_a_new_atom_and_aliases_name_the_same_scaler():
    _, flows = _flows("""
        def f(self, loss, amp):
            s = self.scaler
            if amp:
                s.scale(loss).backward()
            amp = False
            if amp:
                s.step(self.optimizer)
            if self.scaler is not None:
                s.update()
    """)
    first, second, third = _branches(flows["f"].block)
    assert first.atom.text == second.atom.text == "amp"
    assert first.atom != second.atom
    assert not first.shared and not second.shared and not third.shared
    events = flows["f"].events
    assert [(e.kind, e.scaler, e.optimizer) for e in events] == [
        ("scaled_backward", "self.scaler", None),
        ("scaler_step", "self.scaler", "self.optimizer"),
        ("update", "self.scaler", None),
    ]


def test_paths_follow_conditions_and_exits():
    source = """
        def f(scaler, loss, opt, use_amp):
            if use_amp:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if use_amp:
                scaler.step(opt)
                scaler.update()
                return
            opt.step()
    """
    ends, analysis = _ends(source, "f")
    assert ends == {("scaled_backward", "scaler_step", "update"), ("backward", "step")}
    assert analysis.at["step"] == {("backward",)}


def test_raise_break_and_continue_leave_their_paths():
    source = """
        def f(scaler, loss, opt, loader):
            for batch in loader:
                if batch is None:
                    continue
                if batch.last:
                    break
                scaler.scale(loss).backward()
                if batch.bad:
                    raise ValueError
                scaler.step(opt)
            scaler.update()
    """
    ends, analysis = _ends(source, "f")
    # a `for` runs at least once; a path that raised never reaches the update
    assert ends == {("scaled_backward", "scaler_step", "update"), ("update",)}
    assert analysis.at["scaler_step"] == {("scaled_backward",)}


def test_back_edges_carry_a_path_into_the_next_iteration():
    source = """
        def f(scaler, opt, loader, amp):
            for batch in loader:
                if amp:
                    scaler.unscale_(opt)
                norm = clip_norm(batch)
                if not norm:
                    continue
                if amp:
                    scaler.step(opt)
                    scaler.update()
    """
    _, once = _ends(source, "f")
    assert once.at["unscale_"] == {()}
    _, looped = _ends(source, "f", back_edges=True)
    # the skipped iteration ends without update(); the next one unscales again
    assert ("unscale_",) in looped.at["unscale_"]
    # `amp` does not change in the loop: the next iteration takes the same branch
    assert all("update" not in fact or "unscale_" in fact for fact in looped.at["unscale_"])
    loop = next(i for i in _flows(source)[1]["f"].block if isinstance(i, flow.Loop))
    assert loop.assigned == frozenset({"batch", "norm"})


def test_an_atom_the_loop_assigns_is_forgotten_on_the_back_edge():
    source = """
        def f(scaler, opt, loader):
            ready = False
            for batch in loader:
                if ready:
                    scaler.step(opt)
                else:
                    scaler.unscale_(opt)
                if ready:
                    scaler.update()
                ready = batch.done
    """
    _, looped = _ends(source, "f", back_edges=True)
    # within one iteration both tests agree; across the back edge `ready` may have changed
    assert ("unscale_",) in looped.at["scaler_step"]
    assert all(fact[-1] == "scaler_step" for fact in looped.at["update"])


def test_while_may_run_no_iteration_and_for_runs_one():
    source = """
        def f(scaler, optimizers, pending):
            for opt in optimizers:
                scaler.unscale_(opt)
            while pending():
                scaler.step(opt)
            scaler.update()
    """
    ends, _ = _ends(source, "f")
    assert ends == {("unscale_", "update"), ("unscale_", "scaler_step", "update")}


def test_try_handlers_start_anywhere_in_the_body_and_finally_runs_on_every_way_out():
    source = """
        def f(scaler, opt, loss):
            try:
                scaler.scale(loss).backward()
                scaler.step(opt)
            except RuntimeError:
                return
            finally:
                scaler.update()
            opt.step()
    """
    ends, _ = _ends(source, "f")
    assert ends == {
        ("update",),
        ("scaled_backward", "update"),
        ("scaled_backward", "scaler_step", "update"),
        ("scaled_backward", "scaler_step", "update", "step"),
    }


def test_version_gates_keep_only_the_branch_that_runs():
    _, flows = _flows("""
        import torch
        scaler = torch.amp.GradScaler("cuda")
        if torch.__version__ >= "1.6":
            scaler.step(optimizer)
        else:
            optimizer.step()
        scaler.update()
    """)
    block = flows["<module>"].block
    assert not _branches(block)
    assert _kinds(block) == ["scaler_new", "scaler_step", "update"]


def test_events_clips_helpers_autocast_and_scaler_creation():
    ctx, flows = _flows("""
        import torch
        from torch.nn.utils import clip_grad_norm_ as clip

        class Trainer:
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda")

            def _clip(self):
                clip(self.model.parameters(), 1.0)

            def step(self, batch):
                with torch.autocast("cuda"):
                    loss = self.model(batch)
                self.scaler.scale(loss).backward()
                self._clip()
                self.scaler.step(self.optimizer)
    """)
    assert _kinds(flows["__init__"].block) == ["scaler_new"]
    assert flows["__init__"].events[0].scaler == "self.scaler"
    events = flows["step"].events
    assert [e.kind for e in events] == ["autocast_enter", "autocast_exit", "scaled_backward", "clip", "scaler_step"]
    helper = events[3]
    assert ctx.code(helper.node) == "self._clip()" and ctx.code(helper.via.func) == "clip"


def test_a_project_s_own_loss_scaler_is_not_a_grad_scaler():
    _, flows = _flows("""
        class Trainer:
            def __init__(self, fp16):
                self.scaler = DynamicLossScaler(init_scale=4) if fp16 else None

            def step(self, loss):
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.model.parameters())
                self.optimizer.step()
                self.scaler.update()
    """)
    assert [e.kind for e in flows["step"].events] == ["backward", "step"]


def test_mentions_reads_names_and_their_attributes():
    assert flow.mentions("opt", frozenset({"opt"}))
    assert flow.mentions("self.opts[i]", frozenset({"i"}))
    assert flow.mentions("opt.param_groups", frozenset({"opt"}))
    assert not flow.mentions("self.opt", frozenset({"opt"}))
    assert not flow.mentions("optimizer", frozenset({"opt"}))


def test_cost_stays_linear_in_a_long_chain_of_independent_ifs():
    body = "".join(f"    if c{i}:\n        scaler.update()\n" for i in range(200))
    source = "def f(scaler):\n" + body
    ctx = AstContext("example.py", source, Outline.parse(source), loader("cuda"))
    (scope,) = [f for f in flow.flows(ctx) if isinstance(f.scope, ast.FunctionDef)]
    analysis = _Sequences()
    ends = flow.propagate(scope, analysis)
    assert len(ends) <= 5


def test_an_atom_is_forgotten_after_its_last_test():
    body = "".join(f"    if c{i}:\n        scaler.unscale_(opt)\n    if c{i}:\n        scaler.step(opt)\n"
                   for i in range(40))
    source = "def f(scaler, opt):\n" + body
    ctx = AstContext("example.py", source, Outline.parse(source), loader("cuda"))
    (scope,) = [f for f in flow.flows(ctx) if isinstance(f.scope, ast.FunctionDef)]
    first, second = _branches(scope.block)[:2]
    assert first.shared and second.shared and not first.last and second.last
    analysis = _Sequences()
    flow.propagate(scope, analysis)
    # every pair stays correlated (no cap dropped the atoms): each step right after its unscale_
    assert all(fact[-1] == "unscale_" for fact in analysis.at["scaler_step"])


def _loop_with_many_flags(update_condition: str) -> str:
    """A training loop whose unscale_ and step/update sit under the same unchanged flag, with
    nine other flags between them that each steer the path (a clip on a side, each tested
    twice): more paths than the analysis keeps."""
    flags = "".join(f"""
            if cfg.clip{i}:
                torch.nn.utils.clip_grad_norm_(model.parameters(), {i}.0)
            if cfg.clip{i}:
                torch.nn.utils.clip_grad_value_(model.parameters(), {i}.0)""" for i in range(9))
    return f"""
import torch
def train(cfg, model, loader, optimizer, scaler, use_amp):
    for epoch in range(cfg.epochs):
        for step, batch in enumerate(loader):
            loss = model(batch)
            if use_amp:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if use_amp:
                scaler.unscale_(optimizer){flags}
            if {update_condition}:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
"""


def test_past_the_cap_the_conditions_tied_to_the_facts_stay_correlated():
    from amplint.engine.rule import rule_by_code
    from amplint.engine.runner import lint_source

    rules = [rule_by_code(code) for code in ("AMP005", "AMP007")]
    same = lint_source("t.py", _loop_with_many_flags("use_amp"), rules, policy_loader=loader("cuda"))
    assert same.diagnostics == []
    # Updated under another flag: an iteration that unscales can end without update().
    other = lint_source("t.py", _loop_with_many_flags("cfg.step_with_scaler"), rules, policy_loader=loader("cuda"))
    assert sorted(d.code for d in other.diagnostics) == ["AMP005", "AMP007"]


def _every_example_and_fixture() -> list[str]:
    from pathlib import Path

    from amplint.engine.rule import all_rules
    sources = [e.code for r in all_rules() for e in (*r.valid, *r.invalid)]
    sources += [p.read_text() for p in sorted((Path(__file__).parent.parent / "fixtures").rglob("*.py"))]
    return sources


def test_functions_left_unlowered_have_no_event():
    """``flows`` lowers only functions where a call or a `with` may make an event: lowered in
    full, every other function of the rules' examples and the fixtures has none either, and
    some were left out."""
    skipped = 0
    for source in _every_example_and_fixture():
        ctx, _ = _flows(source)
        for lowered in flow.flows(ctx):
            full = flow._Lowering(ctx, lowered.scope).flow()
            assert [(e.kind, e.node) for e in lowered.events] == [(e.kind, e.node) for e in full.events], source
            skipped += not lowered.block and bool(full.block)
    assert skipped > 50


def test_a_file_that_clips_is_lowered_in_full():
    """A call of a helper that clips is an event: where the file clips, every function is lowered."""
    _, flows = _flows("""
        import torch
        def clip(model):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        def train(model, scaler, loss):
            scaler.scale(loss).backward()
            clip(model)
        def log(x):
            if x:
                return 1
    """)
    assert _kinds(flows["train"].block) == [flow.SCALED_BACKWARD, flow.CLIP]
    assert flows["log"].block


def _walked_calls(ctx: AstContext, node: ast.AST) -> list[ast.Call]:
    """The calls of ``node`` by walking it, nested definitions and lambdas left out."""
    calls, stack = [], [node]
    while stack:
        current = stack.pop()
        calls += [current] if isinstance(current, ast.Call) else []
        stack.extend(c for c in ast.iter_child_nodes(current) if not isinstance(c, flow._NESTED))
    return sorted(calls, key=ctx.order)


def test_the_calls_of_a_statement_from_the_index_are_those_a_walk_finds():
    """``calls_in`` answers a statement from the file's call index: for every statement and
    expression of the rules' examples, the fixtures and the shapes where places mislead (a
    decorated definition inside a block, a lambda, an f-string's calls, two statements on a
    line), the calls a walk of it finds, in the same order."""
    tricky = textwrap.dedent("""\
        import torch
        with torch.autocast("cuda"):
            @register(make("a"))
            def inner(x=default()):
                return step(x)
            out = model(x); loss = (lambda y: crit(y))(out) + f"{fmt(out)}"
            print(f"loss {loss.item():.{width()}f}", key=lambda v: sort(v))
        for batch in load(data()):
            scaler.scale(loss(batch)).backward()
        """)
    checked = 0
    for source in [*_every_example_and_fixture(), tricky]:
        ctx, _ = _flows(source)
        for node in ast.walk(ctx.outline.tree):
            if isinstance(node, (ast.stmt, ast.expr)):
                assert flow.calls_in(ctx, node) == _walked_calls(ctx, node), (ast.dump(node)[:200], source)
                checked += 1
    assert checked > 10_000
