"""Lint one source text: prefilter, one parse, every selected rule, noqa, and the fix loop."""

from __future__ import annotations

import ast
import bisect
import re
import sys
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

from . import noqa
from .ast_context import AstContext
from .diagnostics import INTERNAL_ERROR, SYNTAX_ERROR, Diagnostic, Edit, Fix, Location
from .outline import Outline
from .project_index import Dependency, ProjectHints
from .rule import AnyOf, Rule, tolerant_of_spacing

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


class _CodeWord:
    """A plain word of a fragment, found only where it may be code: on a line whose text before
    it starts with no `#` (a comment, or a line of a string) and no `>>>` or `... ` (a
    docstring's example). The words an analysis reads are names, attributes and strings of
    code; in many files they are also, or only, in the prose around it (usage examples in
    docstrings, a comment on why a cast is there)."""

    def __init__(self, word: str):
        self.word = word

    def search(self, text: str) -> bool | None:
        at = text.find(self.word)
        while at != -1:
            head = text[text.rfind("\n", 0, at) + 1:at].lstrip(" \t\f")
            if not (head.startswith(("#", ">>>")) or head.startswith("...") and head[3:4] in ("", " ")):
                return True
            end = text.find("\n", at)
            at = -1 if end == -1 else text.find(self.word, end)
        return None


class Prefilter:
    """Which selected rules can fire on a text, from the rules' fragments.

    A fragment is a regular expression (a plain word: ``_CodeWord``), or a tuple of them that
    must all match, tried in order. Each pattern is searched on its own (one big alternation
    defeats the regex engine's literal scan and is many times slower) and at most once per
    text, however many rules share it. In ``preview`` mode a rule's ``preview_fragments`` stand for its fragments.
    """

    def __init__(self, rules: Sequence[type[Rule]], preview: bool = False):
        compiled: dict[str, re.Pattern | _CodeWord] = {}

        def searcher(pattern: str) -> re.Pattern | _CodeWord:
            return _CodeWord(pattern) if re.escape(pattern) == pattern else re.compile(tolerant_of_spacing(pattern))

        def alternatives(item: str | AnyOf) -> tuple[re.Pattern | _CodeWord, ...]:
            patterns = item.patterns if isinstance(item, AnyOf) else (item,)
            return tuple(compiled.setdefault(p, searcher(p)) for p in patterns)

        self.rules = [(rule, [[alternatives(item) for item in (f if isinstance(f, tuple) else (f,))]
                              for f in (rule.preview_fragments if preview and rule.preview_fragments
                                        else rule.fragments)])
                      for rule in rules]
        # For each rule whose fragment a project's autocast wrapper also satisfies: that
        # fragment's compiled pattern.
        self.wrapper_patterns = {rule: compiled.setdefault(rule.project_wrappers_for,
                                                           searcher(rule.project_wrappers_for))
                                 for rule in rules if rule.project_wrappers_for is not None}
        # For each rule whose fragment a keyword the project passes also satisfies: that
        # fragment's compiled pattern, and the keywords.
        self.keyword_patterns = {rule: (compiled.setdefault(rule.project_keywords_for[0],
                                                            searcher(rule.project_keywords_for[0])),
                                        rule.project_keywords_for[1])
                                 for rule in rules if rule.project_keywords_for is not None}

    def matching(self, text: str, project: "ProjectHints | None" = None) -> list[type[Rule]]:
        """The rules whose fragments the text contains; with the file's ``project``, a rule
        whose ``project_wrappers_for`` fragment is missing also when the text calls one of
        the project's autocast wrappers by name, and one whose ``project_keywords_for``
        fragment is missing also when the project passes one of its keywords (each asked only
        where the rest of a group is found)."""
        seen: dict[re.Pattern | _CodeWord, bool] = {}

        def found(pattern: re.Pattern | _CodeWord) -> bool:
            if pattern not in seen:
                seen[pattern] = pattern.search(text) is not None
            return seen[pattern]

        wrapper_called: list[bool] = []

        def calls_wrapper() -> bool:
            if not wrapper_called:
                names = project.wrapper_names
                wrapper_called.append(any(re.search(rf"\b{re.escape(n)}\s*\(", text) for n in names if n in text))
            return wrapper_called[0]

        def through_project(rule, group) -> bool:
            """The group found when what the project holds stands for one of its fragments: a
            call of the project's own autocast wrapper for the rule's ``project_wrappers_for``,
            a keyword the project passes for its ``project_keywords_for``."""
            stand_ins = []
            if rule in wrappers:
                stand_ins.append((wrappers[rule], calls_wrapper))
            if rule in keywords:
                pattern, names = keywords[rule]
                stand_ins.append((pattern, lambda: project.passes_any(names)))
            for stands_for, holds in stand_ins:
                if any(stands_for in item for item in group) \
                        and all(stands_for in item or any(found(p) for p in item) for item in group) and holds():
                    return True
            return False

        # Plain loops, not nested generators: this runs on every file, most of which match nothing.
        wrappers = self.wrapper_patterns if project is not None else {}
        keywords = self.keyword_patterns if project is not None else {}
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
                if (rule in wrappers or rule in keywords) and through_project(rule, group):
                    matched.append(rule)
                    break
        return matched



@lru_cache(maxsize=64)
def prefilter(rules: tuple[type[Rule], ...], preview: bool = False) -> Prefilter:
    return Prefilter(rules, preview)


def _engine_diagnostic(kind, path, message, row=1, col=1, detail=None) -> Diagnostic:
    return Diagnostic(kind[0], kind[1], message, path, Location(row, col), Location(row, col),
                      detail=detail)


def _syntax_error(path: str, source: str) -> Diagnostic:
    """Why Python's parser refuses the text, where it says."""
    try:
        compile(source, path, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as exc:
        return _engine_diagnostic(SYNTAX_ERROR, path, f"syntax error: {exc.msg}", exc.lineno or 1, exc.offset or 1)
    except (RecursionError, MemoryError):
        return _engine_diagnostic(SYNTAX_ERROR, path, "syntax error: too deeply nested for Python's parser")
    except ValueError as exc:  # a NUL byte
        return _engine_diagnostic(SYNTAX_ERROR, path, f"syntax error: {exc}")
    return _engine_diagnostic(SYNTAX_ERROR, path, "syntax error: Python's parser refuses this file")


def _too_deep(exc: BaseException) -> bool:
    """Whether Python's recursion limit stopped it (directly, or a cleanup it interrupted)."""
    while exc is not None:
        if isinstance(exc, RecursionError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# Code Python accepts can nest thousands of levels deep (a 2,000-term sum compiles): the rules'
# recursive walks of its tree need more C stack than a main thread has (past it, the process
# crashes) and more than Python's default recursion limit. Files are checked in a thread with
# a large stack and a higher limit; what still reaches the limit is reported as too deep.
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
              outline: Outline | None, preview: bool = False) -> tuple[list[Diagnostic], set[Dependency]]:
    """Every diagnostic of ``rules`` on ``source`` (noqa not yet applied), read from its
    ``outline``, and the summaries of the project's other files the rules read for them. No
    outline: Python's parser refuses the text, and why is the one diagnostic."""
    if outline is None:
        return [_syntax_error(path, source)], set()
    return _in_deep_stack(lambda: _run_rules(path, source, rules, policy_loader, outline, preview))


def _run_rules(path: str, source: str, rules: Sequence[type[Rule]], policy_loader: Callable | None,
               outline: Outline, preview: bool) -> tuple[list[Diagnostic], set[Dependency]]:
    ctx = AstContext(path, source, outline, policy_loader, preview)
    return _each_rule(path, rules, ctx), ctx.dependencies


class Abandoned(Exception):
    """A check given up between two rules because its findings are no longer wanted
    (``abandon_when``)."""


_ABANDON: list[Callable[[], bool]] = []


@contextmanager
def abandon_when(superseded: Callable[[], bool]):
    """Within: a check gives up (raises ``Abandoned``) before its next rule once ``superseded()``
    holds. A language server's check of a version the editor has replaced since: the latest
    version's check, waiting behind it, starts one rule later instead of at its end."""
    _ABANDON.append(superseded)
    try:
        yield
    finally:
        _ABANDON.pop()


def _each_rule(path: str, rules: Sequence[type[Rule]], ctx: AstContext) -> list[Diagnostic]:
    """The findings of each rule on the file; a rule that fails is reported, and the others'
    findings stand."""
    out: list[Diagnostic] = []
    for rule in rules:
        if _ABANDON and _ABANDON[-1]():
            raise Abandoned(path)
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
    for _ in range(MAX_FIX_ROUNDS if fix else 1):
        # Rules that cannot fire on this text are not run; a fix can change that, so again
        # each round.
        hints = ProjectHints(path)
        matched = text_match if text_match is not None and text is source else None
        selected = rules if not use_prefilter else matched.rules if matched is not None \
            else prefilter(tuple(rules), preview).matching(text, hints)
        if not selected:
            result.dependencies |= hints.read | (matched.read if matched else frozenset())  # what the answer read
            result.diagnostics = []  # nothing left to find in this text
            break
        outline = Outline.parse(text)
        if outline is not None:
            outline.project = hints  # the project's re-exports, for the file's star imports
        diagnostics, dependencies = run_rules(path, text, selected, policy_loader, outline, preview)
        result.dependencies |= dependencies | hints.read | (matched.read if matched else frozenset())
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
        if Outline.parse(new_text, keep=True) is None:  # never hand back code that does not parse
            result.diagnostics.append(_engine_diagnostic(
                INTERNAL_ERROR, path, f"a fix produced code that does not parse ({_syntax_error(path, new_text).message}); "
                "the file was left as it was before that fix"))
            break
        if new_text == text:
            break
        text, result.fixes_applied = new_text, result.fixes_applied + applied
    result.source = text
    result.internal_errors = sum(d.code == INTERNAL_ERROR[0] for d in result.diagnostics)
    result.diagnostics.sort(key=lambda d: d.sort_key)
    return result
