from __future__ import annotations

from ..engine import noqa
from ..engine.ast_context import AstContext
from ..engine.diagnostics import Diagnostic, Fix
from ..engine.rule import Invalid, Rule, Valid, all_rules
from ..engine.diagnostics import INTERNAL_ERROR, SYNTAX_ERROR
from ..engine.runner import prefilter

_ENGINE_CODES = {SYNTAX_ERROR[0]: SYNTAX_ERROR[1], INTERNAL_ERROR[0]: INTERNAL_ERROR[1]}


class UnusedNoqa(Rule):
    """
    ## What it does
    Finds the codes of a `# noqa: AMP...` comment that suppress nothing on their line: no
    finding of that rule starts there, the code is not a rule's (`AMP404`, a typo), it is an
    engine code (`AMP000`, `AMP999`: never suppressed), or it is named twice. Codes of other
    tools (`E501`, `F401`) and a blanket `# noqa` are left alone.

    ## Why is this bad?
    A suppression outlives the finding it was written for: the code was fixed or moved, and
    the comment now hides whatever that rule will find on the line next time, unseen. A
    misspelled code never suppressed anything, and says that someone thought it did.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = model(x).mean()
    scaler.scale(loss).backward()  # noqa: AMP001
    ```

    ## Fix
    ```python
    with torch.autocast("cuda"):
        loss = model(x).mean()
    scaler.scale(loss).backward()
    ```

    ## Fix safety
    Safe: only the unused codes go; the comment goes when no code is left (the line too when
    the comment was all it held), other words in the comment stay. Findings are not changed:
    every code removed suppressed nothing.

    ## False positives
    None known. Whether a code is used is decided by running that rule on the file, whether or
    not this run selects it; ruff's RUF100 instead reports the codes of rules the run leaves
    out, so that `--select AMP100 --fix` would strip every suppression. Off by default, as
    RUF100 is: `--extend-select AMP100`.

    ## Design
    A rule, not an engine feature, although it depends on other rules' findings: it asks
    those rules itself. For each code the file's directives name, it runs that rule on the
    same parsed tree (in a context of its own, so the engine's run is untouched; rules whose
    fragments the file lacks are not run) and notes the lines it reports on. So it needs no
    engine support, it works the same in `amplint check`, `amplint.check_source`, the flake8
    plugin and `--fix` (in the fix loop it sees the text of each round, and a code stays as
    long as its finding does), and it costs nothing in files without an AMP noqa comment.
    """

    code = "AMP100"
    name = "unused-noqa"
    summary = "A `# noqa` code that suppresses nothing on its line: no such finding there, unknown, or named twice"
    fixable = True
    on_by_default = False
    # A directive that names an AMP code (any case, as `# noqa` is read).
    fragments = (r"(?i)noqa:[^\n]*amp",)

    valid = (
        Valid("""
import torch

def train_step(model, batch, optimizer, scaler):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch).mean()
        scaler.scale(loss).backward()  # noqa: AMP001 (measured: the region is tiny)
    scaler.step(optimizer)
    scaler.update()
    lr = 3e-4  # noqa: E501
    return loss  # noqa
"""),
    )
    invalid = (
        Invalid("""
import torch

def train_step(model, batch, optimizer, scaler):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch).mean()
        scaler.scale(loss).backward()  # noqa: AMP001, AMP002
    scaler.step(optimizer)  # noqa: AMP006
    scaler.update()
    probs = torch.softmax(loss, 0)  # NOQA: amp404
""", fixed="""
import torch

def train_step(model, batch, optimizer, scaler):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(batch).mean()
        scaler.scale(loss).backward()  # noqa: AMP001
    scaler.step(optimizer)
    scaler.update()
    probs = torch.softmax(loss, 0)
""", at=((7, 40, "AMP002 (no such finding on this line)"), (8, 29, "AMP006 (no such finding on this line)"),
         (10, 37, "AMP404 (not a rule's code)"))),
        Invalid("""
import torch
from torch.cuda.amp import GradScaler  # noqa: AMP004, AMP004
scaler = GradScaler()  # type: ignore  # noqa: AMP000
    # noqa: AMP013
logits = model(x)  # noqa: AMP013 -- kept from the old loss
""", fixed="""
import torch
from torch.cuda.amp import GradScaler  # noqa: AMP004
scaler = GradScaler()  # type: ignore
logits = model(x)  # -- kept from the old loss
""", at=((3, 40, "AMP004 (named twice)"), (4, 40, "AMP000 (the engine's syntax-error code"),
         (5, 5, "AMP013 (no such finding"), (6, 20, "AMP013 (no such finding"))),
    )

    def check(self, ctx: AstContext) -> None:
        directives = noqa.directives(ctx.source)
        if not directives:
            return
        rules = {r.code: r for r in all_rules() if r.code != self.code}
        named = sorted({c.code for d in directives for c in d.codes if c.code in rules})
        reported = self._rows_reported(ctx, [rules[code] for code in named])
        for directive in directives:
            unused: dict[int, str] = {}
            seen: set[str] = set()
            for i, c in enumerate(directive.codes):
                if not noqa.is_amp_code(c.code) or c.code == self.code:
                    continue  # another tool's code; our own is the engine's to apply
                if c.code in seen:
                    why = "named twice"
                elif c.code in _ENGINE_CODES:
                    why = f"the engine's {_ENGINE_CODES[c.code]} code, which `# noqa` never suppresses"
                elif c.code not in rules:
                    why = "not a rule's code"
                elif reported.get(c.code) is not None and directive.row not in reported[c.code]:
                    why = "no such finding on this line"
                else:
                    seen.add(c.code)
                    continue
                seen.add(c.code)
                unused[i] = f"{c.code} ({why})"
            if unused:
                self._report(ctx, directive, unused)

    @staticmethod
    def _rows_reported(ctx: AstContext, rules: list[type[Rule]]) -> dict[str, set[int] | None]:
        """The rows each rule reports on (None: unknown, the rule failed; its codes count as
        used). Each runs in a context of its own on the same tree."""
        rows: dict[str, set[int] | None] = {r.code: set() for r in rules}
        if not rules:
            return rows
        own = AstContext(ctx.path, ctx.source, ctx.outline, ctx.policy_loader, ctx.preview)
        for rule in prefilter(tuple(rules), ctx.preview).matching(ctx.source):
            own._rule, own.diagnostics = rule, []
            try:
                rule().check(own)
            except Exception:  # the engine reports a failing rule where it runs it
                rows[rule.code] = None
                continue
            rows[rule.code] = {d.location.row for d in own.diagnostics}
        ctx.dependencies |= own.dependencies  # then so do this rule's findings
        return rows

    def _report(self, ctx: AstContext, directive: noqa.Directive, unused: dict[int, str]) -> None:
        whole = len(unused) == len(directive.codes)
        edit = noqa.removal(ctx.source, directive, set(unused))
        fix = Fix("Remove the `# noqa` comment" if whole else
                  f"Remove {', '.join(directive.codes[i].code for i in unused)} from the `# noqa`", (edit,))
        plural = "s" if len(unused) > 1 else ""
        ctx.diagnostics.append(Diagnostic(
            code=self.code, name=self.name,
            message=f"unused `# noqa` code{plural}: {'; '.join(unused.values())}",
            path=ctx.path, location=ctx.location(directive.start), end_location=ctx.location(directive.end),
            fix=fix, url=self.url(),
            edit_locations=[(ctx.location(edit.start), ctx.location(edit.end), edit.content)]))
