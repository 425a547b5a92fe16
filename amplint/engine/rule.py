"""The Rule base class, rule examples, and discovery of every rule in ``amplint.rules``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar, Iterator

if TYPE_CHECKING:
    from .ast_context import AstContext

CODE_PATTERN = re.compile(r"^AMP\d{3}$")


def _parenthesized(depth: int) -> str:
    inner = r"[^()]" if depth == 0 else rf"(?:[^()]|{_parenthesized(depth - 1)})"
    return rf"\({inner}*\)"


# For fragments: a parenthesized group, parentheses nested up to four deep.
PARENTHESIZED = _parenthesized(3)


def call_with(callee: str, argument: str) -> str:
    """A fragment for a call of ``callee`` (a suffix of the callee's name) whose own arguments (not a nested call's) contain
    ``argument``, over any number of lines. Parentheses nest up to four deep; a string or a
    comment with an unbalanced parenthesis inside the call makes the fragment miss, which the
    prefilter's soundness tests would show."""
    return rf"(?:{callee})\s*\((?:[^()]|{PARENTHESIZED})*?{argument}"


_NAME_CHAR = re.compile(r"\w")
# What Python reads as blank between two tokens: spaces, line breaks (inside brackets, which a
# fragment cannot tell), and a backslash that continues the line. One class, a stray backslash
# let in: a repeated class is many times faster to match than a repeated alternation.
_SPACE = r"[\s\\]"
# `()` as Python reads it: spaces, line breaks, continuations and comments may come between.
_EMPTY_PARENTHESES = r"\((?:\s|\\|#[^\n]*)*\)"


def _class_end(pattern: str, start: int) -> int:
    """The index just past the character class that opens at ``start``."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):  # a `]` first is a member
        i += 1
    while pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def tolerant_of_spacing(pattern: str) -> str:
    """``pattern`` as the prefilter searches it. Python allows spaces and, inside brackets,
    line breaks around the dot of an attribute (`scaler . scale`, a call chain over lines) and
    before a call's parenthesis (`scale (loss)`), blanks and comments inside an empty call's
    (`float( )`), a statement inside parentheses over several lines, and a backslash that
    continues a line wherever a space may stand. So `\\.` and `name\\(` match with ``_SPACE``
    around them, `\\(\\)` as ``_EMPTY_PARENTHESES``, `[^\\n]*` (rest of a line) also across
    line breaks, up to 500 characters, and `\\s`, or a class that holds a space (`[ \\t]`,
    `[\\s)]`), also a continuation. A rule writes its fragments as the code is usually
    spelled; the soundness tests try the other spellings."""
    out: list[str] = []
    run = [False]  # whether the output ends with a repeated class that holds every blank

    def emit(*pieces: str, blank_run: bool = False) -> None:
        out.extend(pieces)
        run[0] = blank_run

    def blanks() -> None:
        """Blanks, unless the output ends with some already (a mismatch after two repeats
        of the same characters tries every split of a long run between them) or is empty (a
        literal first is what the regex engine scans for)."""
        if out and not run[0]:
            emit(_SPACE, "*", blank_run=True)

    i = 0
    while i < len(pattern):
        after_name = bool(out) and _NAME_CHAR.fullmatch(out[-1][-1]) is not None
        if pattern.startswith("[^\\n]*", i):
            emit("(?:[^\\n]*|[^;]{0,500})")
            i += len("[^\\n]*")
        elif pattern.startswith("\\(\\)", i):
            if after_name:
                blanks()
            emit(_EMPTY_PARENTHESES)
            i += 4
        elif pattern[i] == "[":
            end = _class_end(pattern, i)
            members = pattern[i:end]
            blank = not members.startswith("[^") and any(m in members for m in (" ", "\\t", "\\s"))
            widened = members[:-1] + "\\s\\\\]" if blank else members
            if blank and pattern.startswith("*", end):
                only_blanks = not re.sub(r" |\\[tsnr\\]", "", members[1:-1])
                if not (run[0] and only_blanks):  # else the blanks already there say it
                    emit(widened, "*", blank_run=True)
                i = end + 1
            else:
                emit(widened)
                i = end
        elif pattern[i] == "\\":
            escape = pattern[i:i + 2]
            i += 2
            if escape == "\\.":
                blanks()
                emit("\\.")
                blanks()
            elif escape == "\\(" and after_name:
                blanks()
                emit("\\(")
            elif escape == "\\s" and pattern.startswith("*", i):
                blanks()
                i += 1
            else:
                emit(_SPACE if escape == "\\s" else escape)
        else:
            emit(pattern[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class AnyOf:
    """In a fragment's all-of tuple: any one of these patterns. Each is searched on its own,
    so each can start with a literal (an alternation at the start of a single regular
    expression makes the engine try every position of the file)."""

    patterns: tuple[str, ...]

    def __init__(self, *patterns: str):
        object.__setattr__(self, "patterns", patterns)


@dataclass(frozen=True)
class Valid:
    """Code on which the rule must stay silent. ``project``: the other files of the project
    the example belongs to, as (path, text) pairs (the example is ``example.py`` at its root):
    what a rule reads of other files (``project_index``)."""

    code: str
    project: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Invalid:
    """Code on which the rule must report, where, what, and what its fixes produce.

    ``at`` lists every finding the rule makes here, in order: its row and column (1-based)
    and a part of its message. ``fixed`` is the expected source after applying this rule's
    fixes (unsafe ones included); None means the rule offers no fix here. ``project``: as
    ``Valid``'s.
    """

    code: str
    fixed: str | None = None
    at: tuple[tuple[int, int, str], ...] = ()
    project: tuple[tuple[str, str], ...] = ()


class Rule:
    """One AMP mistake. Subclasses set the class attributes and implement ``check``, which
    reads the file's ``ast`` (``ast_context.AstContext``); a fix is edits of the text at the
    nodes' offsets (``AstContext.replace``), the rest of the text as it was.

    The class docstring is the rule's documentation, in markdown, with the sections
    "What it does", "Why is this bad?", "Example", "Fix", "Fix safety" and "False positives".
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    fixable: ClassVar[bool] = False
    # Regular expressions without which the rule cannot fire (a tuple inside: all of them, in
    # order; an ``AnyOf`` inside a tuple: one of its patterns): files that contain none of any
    # selected rule's fragments are never parsed. A plain word is found only on a line that may
    # be code (not a comment's, nor a docstring example's: `runner._CodeWord`). Start a
    # file-wide search with a literal: the regex engine finds literal prefixes fast, while a
    # leading `\b`, class or alternation makes it try every position.
    fragments: ClassVar[tuple[str | tuple[str | AnyOf, ...], ...]]
    # Where the rule's preview paths need less of a file than its other paths: the fragments
    # of all its paths, which the prefilter asks instead in preview mode.
    preview_fragments: ClassVar[tuple[str | tuple[str | AnyOf, ...], ...] | None] = None
    # A fragment (one of the patterns in `fragments`) that a call of one of the project's own
    # autocast wrappers also satisfies (`with amp_ctx():` is a region although the file never
    # says `autocast`): the prefilter then also asks the file's project for their names
    # (`project_index.ProjectHints`).
    project_wrappers_for: ClassVar[str | None] = None
    # Likewise a fragment that a keyword argument passed anywhere in the file's project also
    # satisfies, with those keywords (an FSDP precision policy handed to a wrap in another
    # module: `mixed_precision=...`): `project_index.ProjectHints.passes_any`.
    project_keywords_for: ClassVar[tuple[str, tuple[str, ...]] | None] = None
    # Whether the rule reads the op-policy tables in policies/.
    uses_policy: ClassVar[bool] = False
    # False for a style rule: only a select that names it (or a prefix of it) turns it on.
    on_by_default: ClassVar[bool] = True
    # True while the rule's triaged precision (benchmarks/triage) is below 0.9: it runs only
    # with --preview (`preview = true`), selected or not. A rule whose other paths reach the
    # bar reports its weaker ones with ``ctx.report(..., preview=True)`` instead.
    preview: ClassVar[bool] = False
    # For the docs, where some paths report only in preview mode: which ones.
    preview_paths: ClassVar[str] = ""
    valid: ClassVar[tuple[Valid, ...]] = ()
    invalid: ClassVar[tuple[Invalid, ...]] = ()

    def check(self, ctx: "AstContext") -> None:
        raise NotImplementedError

    @classmethod
    def documentation(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()

    @classmethod
    def url(cls) -> str:
        return f"https://github.com/amplint/amplint/blob/main/docs/rules.md#{cls.code.lower()}-{cls.name}"


def _rule_classes(package: str) -> Iterator[type[Rule]]:
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                yield obj


@lru_cache(maxsize=None)
def all_rules(package: str = "amplint.rules") -> tuple[type[Rule], ...]:
    """Every rule in the package, sorted by code. Rules are found, never listed."""
    rules = sorted(_rule_classes(package), key=lambda r: r.code)
    seen: dict[str, str] = {}
    for r in rules:
        if not CODE_PATTERN.match(r.code):
            raise RuntimeError(f"rule {r.__name__} has a malformed code {r.code!r}")
        if r.code in seen:
            raise RuntimeError(f"rule code {r.code} used by both {seen[r.code]} and {r.__name__}")
        seen[r.code] = r.__name__
    return tuple(rules)


def rule_by_code(code: str) -> type[Rule] | None:
    return next((r for r in all_rules() if r.code == code), None)
