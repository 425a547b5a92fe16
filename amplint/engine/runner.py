"""Lint one source text: prefilter, one parse, every selected rule, noqa, and the fix loop."""

from __future__ import annotations

import ast
import bisect
import re
import sys
import threading
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

import libcst as cst

from . import noqa
from .ast_context import AstContext
from .checked_file import CheckedFile
from .context import FileContext
from .diagnostics import INTERNAL_ERROR, SYNTAX_ERROR, Diagnostic, Edit, Fix, Location
from .outline import Outline
from .project_index import Dependency, ProjectHints
from .rule import AnyOf, AstRule, Rule, TextTest, tolerant_of_spacing
from .tree import parse

MAX_FIX_ROUNDS = 10


@dataclass
class FileResult:
    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    source: str | None = None  # the text after fixes, when a fix mode was asked
    fixes_applied: int = 0
    internal_errors: int = 0
    diff: str | None = None  # with --diff: what the fixes would change
    # Summaries of the project's other files the findings were computed from (project_index)
    dependencies: set[Dependency] = field(default_factory=set)
    from_cache: bool = False  # answered by the result cache, not checked again


@dataclass(frozen=True)
class TextMatch:
    """What the prefilter's text stage found in a file (``Prefilter.matching``), handed to the
    check of the same bytes in another process so that it does not search them again: the
    rules whose fragments the text contains, what of the project that answer read, and the
    bytes' checksum (``zlib.crc32``: the file may have changed since)."""

    checksum: int
    rules: tuple[type[Rule], ...]
    read: frozenset


class Prefilter:
    """Which selected rules can fire on a text, from the rules' fragments, then (for rules
    that have one) their ``may_fire`` test on the file's ``ast``.

    A fragment is a regular expression, or a tuple of them that must all match, tried in
    order. Each pattern is searched on its own (one big alternation defeats the regex
    engine's literal scan and is many times slower) and at most once per text, however many
    rules share it.

    With a project's own tables (``project_tables``), the ``may_fire`` of a rule that reads the
    tables is not asked: it knows only the committed tables, and the project's may make any of
    its calls an op they list.
    """

    def __init__(self, rules: Sequence[type[Rule]], project_tables: bool = False):
        self.project_tables = project_tables
        compiled: dict[str, re.Pattern | str] = {}

        def searcher(pattern: str) -> re.Pattern | str:
            # A plain word is found faster by ``in`` than by the regex engine.
            return pattern if re.escape(pattern) == pattern else re.compile(tolerant_of_spacing(pattern))

        def alternatives(item: str | AnyOf | TextTest) -> tuple[re.Pattern | str | TextTest, ...]:
            if isinstance(item, TextTest):
                return (item,)
            patterns = item.patterns if isinstance(item, AnyOf) else (item,)
            return tuple(compiled.setdefault(p, searcher(p)) for p in patterns)

        self.rules = [(rule, [[alternatives(item) for item in (f if isinstance(f, tuple) else (f,))]
                              for f in rule.fragments])
                      for rule in rules]
        # For each rule whose fragment a project's autocast wrapper also satisfies: that
        # fragment's compiled pattern.
        self.wrapper_patterns = {rule: compiled.setdefault(rule.project_wrappers_for,
                                                           searcher(rule.project_wrappers_for))
                                 for rule in rules if rule.project_wrappers_for is not None}

    def matching(self, text: str, project: "ProjectHints | None" = None) -> list[type[Rule]]:
        """The rules whose fragments the text contains; with the file's ``project``, a rule
        whose ``project_wrappers_for`` fragment is missing also when the text calls one of
        the project's autocast wrappers by name (asked only where the rest of a group is found)."""
        seen: dict[re.Pattern | str | TextTest, bool] = {}

        def found(pattern: re.Pattern | str | TextTest) -> bool:
            if pattern not in seen:
                kind = type(pattern)
                seen[pattern] = pattern in text if kind is str else pattern.test(text) if kind is TextTest \
                    else pattern.search(text) is not None
            return seen[pattern]

        wrapper_called: list[bool] = []

        def calls_wrapper() -> bool:
            if not wrapper_called:
                names = project.wrapper_names
                wrapper_called.append(any(re.search(rf"\b{re.escape(n)}\s*\(", text) for n in names if n in text))
            return wrapper_called[0]

        def through_wrapper(rule, group) -> bool:
            """The group found when a call of the project's own autocast wrapper stands for
            the rule's ``project_wrappers_for`` fragment."""
            stands_for = wrappers[rule]
            if not any(stands_for in item for item in group):
                return False
            return all(stands_for in item or any(found(p) for p in item) for item in group) and calls_wrapper()

        # Plain loops, not nested generators: this runs on every file, most of which match nothing.
        wrappers = self.wrapper_patterns if project is not None else {}
        matched = []
        for rule, groups in self.rules:
            for group in groups:
                for item in group:
                    for pattern in item:
                        hit = seen.get(pattern)
                        if hit is None:
                            hit = found(pattern)
                        if hit:
                            break
                    else:
                        break  # no pattern of this item: the group is missing
                else:
                    matched.append(rule)
                    break
                if rule in wrappers and through_wrapper(rule, group):
                    matched.append(rule)
                    break
        return matched

    def select(self, text: str) -> list[type[Rule]]:
        """The rules worth running on the text: fragments found and ``may_fire`` passed. When
        Python cannot parse the text, every rule whose fragments match (libcst reports why)."""
        return self.select_with_outline(text)[0]

    def select_with_outline(self, text: str, project: "ProjectHints | None" = None,
                            candidates: Sequence[type[Rule]] | None = None
                            ) -> tuple[list[type[Rule]], Outline | None]:
        """``select``, and the outline it read (None if no rule needed one). ``project``: what
        the rules' tests may ask of the file's project (``project_index.ProjectHints``);
        ``candidates``: what ``matching`` found in this text already."""
        if candidates is None:
            candidates = self.matching(text, project)
        # the outline, with the project's facts, for the tests and for the rules that read it
        if all(rule.may_fire is None and not issubclass(rule, AstRule) for rule in candidates):
            return candidates, None
        outline = Outline.parse(text)
        if outline is not None:
            outline.project = project
        return [rule for rule in candidates
                if rule.may_fire is None or outline is None or (self.project_tables and rule.uses_policy)
                or rule.may_fire(outline)], outline

    def search(self, text: str) -> bool:
        """Whether the text is worth parsing with libcst for any of the rules."""
        return bool(self.select(text))


@lru_cache(maxsize=64)
def prefilter(rules: tuple[type[Rule], ...], project_tables: bool = False) -> Prefilter:
    return Prefilter(rules, project_tables)


def _engine_diagnostic(kind, path, message, row=1, col=1, detail=None) -> Diagnostic:
    return Diagnostic(kind[0], kind[1], message, path, Location(row, col), Location(row, col),
                      detail=detail)


def _syntax_error(path: str, source: str, exc: cst.ParserSyntaxError) -> Diagnostic:
    # Python's own parser places the error precisely; libcst's positions can be off.
    try:
        compile(source, path, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as py_exc:
        return _engine_diagnostic(SYNTAX_ERROR, path, f"syntax error: {py_exc.msg}",
                                  py_exc.lineno or 1, py_exc.offset or 1)
    except ValueError:  # e.g. NUL bytes; reported by libcst's message below
        pass
    return _engine_diagnostic(SYNTAX_ERROR, path, f"libcst cannot parse this file: {exc.message}",
                              exc.raw_line, exc.raw_column + 1)


def _too_deep(exc: BaseException) -> bool:
    """Whether Python's recursion limit stopped it (directly, or a cleanup it interrupted)."""
    while exc is not None:
        if isinstance(exc, RecursionError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _nesting_error(path: str, source: str) -> Diagnostic | None:
    """Python's own error for code nested deeper than its parser allows (libcst accepts some
    such code). Other errors of Python's parser are not reported here: libcst reads syntax of
    newer Pythons than the one amplint runs on."""
    try:
        compile(source, path, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as exc:
        if "nested" in (exc.msg or ""):
            return _engine_diagnostic(SYNTAX_ERROR, path, f"syntax error: {exc.msg}", exc.lineno or 1, exc.offset or 1)
    except (RecursionError, MemoryError):
        return _engine_diagnostic(SYNTAX_ERROR, path, "syntax error: too deeply nested for Python's parser")
    except ValueError:
        pass
    return None


# Code Python accepts can nest thousands of levels deep (a 2,000-term sum compiles): libcst's
# native parser and the rules' walks of it need more C stack than a main thread has (past it,
# the process crashes) and more than Python's default recursion limit. Files are parsed and
# checked in a thread with a large stack and a higher limit; what still reaches the limit is
# reported as too deep.
_DEEP_STACK_BYTES = 256 * 1024 * 1024
_DEEP_RECURSION_LIMIT = 20_000


def _in_deep_stack(work: Callable[[], tuple]) -> tuple:
    done: list = []

    def target() -> None:
        try:
            done.append((work(), None))
        except BaseException as exc:  # raised again in the caller's thread
            done.append((None, exc))

    limit = sys.getrecursionlimit()
    size = threading.stack_size(_DEEP_STACK_BYTES)
    try:
        sys.setrecursionlimit(max(limit, _DEEP_RECURSION_LIMIT))
        thread = threading.Thread(target=target, name="amplint-check")
        thread.start()
        thread.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    result, exc = done[0]
    if exc is not None:
        raise exc
    return result


def run_rules(path: str, source: str, rules: Sequence[type[Rule]], policy_loader: Callable | None,
              outline: Outline | None = None, preview: bool = False) -> tuple[list[Diagnostic], set[Dependency]]:
    """Every diagnostic of ``rules`` on ``source`` (noqa not yet applied), and the summaries of
    the project's other files the rules read for them."""
    if outline is None:  # Python's parser has not read it: what it refuses as too deep, libcst never sees
        nesting = _nesting_error(path, source)
        if nesting is not None:
            return [nesting], set()
    return _in_deep_stack(lambda: _run_rules(path, source, rules, policy_loader, outline, preview))


def _run_rules(path: str, source: str, rules: Sequence[type[Rule]],
               policy_loader: Callable | None, outline: Outline | None,
               preview: bool) -> tuple[list[Diagnostic], set[Dependency]]:
    out: list[Diagnostic] = []
    dependencies: set[Dependency] = set()
    on_ast = [rule for rule in rules if issubclass(rule, AstRule)]
    on_libcst = [rule for rule in rules if not issubclass(rule, AstRule)]
    if on_ast:
        hints = None
        if outline is None:  # no prefilter read it: parsed here, with what it may ask of the project
            outline = Outline.parse(source)
            if outline is not None:
                outline.project = hints = ProjectHints(path)
        if outline is not None:
            ast_ctx = AstContext(path, source, outline, policy_loader, preview)
            out += _each_rule(path, on_ast, ast_ctx)
            dependencies |= ast_ctx.dependencies | (hints.read if hints is not None else set())
            if not on_libcst:
                return out, dependencies
    # libcst's parse: for the rules that read its tree, and to say why Python could not parse it
    try:
        module = parse(source)
    except cst.ParserSyntaxError as exc:
        return [_syntax_error(path, source, exc)], set()
    except RecursionError:
        return [_nesting_error(path, source) or _engine_diagnostic(
            INTERNAL_ERROR, path, f"cannot check {path}: nested too deeply for libcst's parser")], set()
    ctx = FileContext(path, source, module, policy_loader, outline, preview)
    out += _each_rule(path, on_libcst, ctx)
    return out, dependencies | ctx.dependencies


def _each_rule(path: str, rules: Sequence[type[Rule]], ctx: CheckedFile) -> list[Diagnostic]:
    """The findings of each rule on the file; a rule that fails is reported, and the others'
    findings stand."""
    out: list[Diagnostic] = []
    for rule in rules:
        ctx._rule = rule
        ctx.diagnostics = []
        try:
            rule().check(ctx)
        except Exception as exc:  # one broken rule must not hide the others' findings
            if _too_deep(exc):
                out.append(_engine_diagnostic(
                    INTERNAL_ERROR, path, f"cannot check {path} for {rule.code} ({rule.name}): its code is "
                    "nested deeper than Python's recursion limit; the other rules' findings stand"))
                continue
            out.append(_engine_diagnostic(
                INTERNAL_ERROR, path, f"internal error in {rule.code} ({rule.name}): "
                f"{type(exc).__name__}: {exc}", detail=traceback.format_exc()))
            continue
        out.extend(ctx.diagnostics)
    return out


def _overlaps(a: Edit, b: Edit) -> bool:
    if a == b:
        return False
    if a.start == a.end == b.start == b.end:
        return True
    return a.start < b.end and b.start < a.end


class _AcceptedEdits:
    """Edits that do not overlap, sorted: sorted by start, their ends rise too, so the only
    ones a new edit can overlap lie between the first that ends at or after its start and the
    last that starts at or before its end (a bisection, then a few steps, not a scan of all)."""

    def __init__(self):
        self.edits: list[Edit] = []
        self.ends: list[int] = []

    def overlaps(self, edit: Edit) -> bool:
        i = bisect.bisect_left(self.ends, edit.start)
        while i < len(self.edits) and self.edits[i].start <= edit.end:
            if _overlaps(edit, self.edits[i]):
                return True
            i += 1
        return False

    def add(self, edit: Edit) -> None:
        i = bisect.bisect_left(self.edits, edit)
        if i == len(self.edits) or self.edits[i] != edit:
            self.edits.insert(i, edit)
            self.ends.insert(i, edit.end)


def accepted_edits(fixes: Sequence[Fix]) -> tuple[list[Edit], int]:
    """The edits of as many fixes as do not overlap, taken in source order, sorted; and how
    many fixes they make."""
    accepted = _AcceptedEdits()
    applied = 0
    for fix in sorted(fixes, key=lambda f: min(e.start for e in f.edits)):
        if any(accepted.overlaps(e) for e in fix.edits):
            continue
        for edit in fix.edits:
            accepted.add(edit)
        applied += 1
    return accepted.edits, applied


def apply_fixes(source: str, fixes: Sequence[Fix]) -> tuple[str, int]:
    """Apply as many fixes as do not overlap, in source order; (new text, fixes applied)."""
    edits, applied = accepted_edits(fixes)
    pieces, at = [], 0
    for edit in edits:
        pieces += [source[at:edit.start], edit.content]
        at = edit.end
    pieces.append(source[at:])
    return "".join(pieces), applied


def _fixes_to_apply(kept: list[Diagnostic], suppressed: list[Diagnostic], unsafe: bool) -> list[Fix]:
    def applicable(d: Diagnostic) -> bool:
        return d.fix is not None and (unsafe or d.fix.applicability == "safe")

    # A group applies only if every one of its members is being fixed.
    blocked = {d.fix.group for d in suppressed if d.fix and d.fix.group}
    blocked |= {d.fix.group for d in kept if d.fix and d.fix.group and not applicable(d)}
    return [d.fix for d in kept if applicable(d) and d.fix.group not in blocked]


# Applies fixes to a text: (the new text, fixes applied). A notebook's leaves out what its cells
# cannot take.
FixApplier = Callable[[str, Sequence[Fix]], "tuple[str, int]"]


def lint_source(path: str, source: str, rules: Sequence[type[Rule]], *,
                fix: bool = False, unsafe: bool = False, policy_loader: Callable | None = None,
                use_prefilter: bool = True, apply: FixApplier = apply_fixes,
                text_match: TextMatch | None = None, preview: bool = False) -> FileResult:
    """The findings in ``source`` after as many rounds of fixes as asked (``result.source``:
    the text they point into). ``text_match``: what the prefilter's text stage found in
    ``source`` already."""
    result = FileResult(path)
    text = source
    project_tables = getattr(policy_loader, "policies", None) is not None
    for _ in range(MAX_FIX_ROUNDS if fix else 1):
        # Rules that cannot fire on this text are not run; a fix can change that, so again
        # each round.
        hints = ProjectHints(path)
        matched = text_match if text_match is not None and text is source else None
        selected, outline = prefilter(tuple(rules), project_tables).select_with_outline(
            text, hints, None if matched is None else matched.rules) if use_prefilter else (rules, None)
        result.dependencies |= hints.read | (matched.read if matched else frozenset())  # what the answer read
        if not selected:
            result.diagnostics = []  # nothing left to find in this text
            break
        diagnostics, dependencies = run_rules(path, text, selected, policy_loader, outline, preview)
        result.dependencies |= dependencies
        suppressions = noqa.parse(text, outline) if diagnostics else noqa.Suppressions()
        kept, suppressed = [], []
        for d in diagnostics:
            engine = d.code in (SYNTAX_ERROR[0], INTERNAL_ERROR[0])
            (kept if engine or not suppressions.suppresses(d.location.row, d.code) else suppressed).append(d)
        result.diagnostics = kept
        if not fix:
            break
        fixes = _fixes_to_apply(kept, suppressed, unsafe)
        if not fixes:
            break
        new_text, applied = apply(text, fixes)
        try:
            parse(new_text)
        except cst.ParserSyntaxError as exc:  # never hand back code that does not parse
            result.diagnostics.append(_engine_diagnostic(
                INTERNAL_ERROR, path, f"a fix produced code that does not parse ({exc.message}); "
                "the file was left as it was before that fix"))
            break
        if new_text == text:
            break
        text, result.fixes_applied = new_text, result.fixes_applied + applied
    result.source = text
    result.internal_errors = sum(d.code == INTERNAL_ERROR[0] for d in result.diagnostics)
    result.diagnostics.sort(key=lambda d: d.sort_key)
    return result
