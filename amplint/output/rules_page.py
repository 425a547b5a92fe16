"""docs/rules.md, the page every finding's ``url`` points to, made from the rules' own docs:
``amplint rules --format markdown > docs/rules.md`` (a test keeps the committed page current)."""

from __future__ import annotations

from ..engine.diagnostics import INTERNAL_ERROR, SYNTAX_ERROR
from ..engine.rule import Rule, all_rules, rule_by_code


# The codes the engine itself reports: (name, what it means).
ENGINE_CODES = {
    SYNTAX_ERROR[0]: (SYNTAX_ERROR[1], "A file amplint reads does not parse; its other findings cannot be "
                                       "known. Not suppressed by `# noqa`."),
    INTERNAL_ERROR[0]: (INTERNAL_ERROR[1], "A file that cannot be read or written, or a rule that failed on it "
                                           "(`--verbose` shows the traceback); the other rules still ran. Exit code 2."),
}


def rule_text(code: str) -> str | None:
    """A rule's (or an engine code's) documentation as `amplint rule CODE` prints it; None for
    an unknown code."""
    rule = rule_by_code(code)
    if rule is None and code in ENGINE_CODES:
        name, meaning = ENGINE_CODES[code]
        return f"# {code} {name}\n\n{meaning}"
    if rule is None:
        return None
    fix = "Fix available." if rule.fixable else "No fix."
    status = f"{tier(rule)}\n\n" if tier(rule) else ""
    return f"# {rule.code} {rule.name}\n\n{rule.summary}\n\n{fix}\n\n{status}{rule.documentation()}"


def _demoted(markdown: str) -> str:
    """A rule's ``## Section`` headings one level down, under the rule's own; code blocks untouched."""
    lines, in_code = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        lines.append("#" + line if line.startswith("#") and not in_code else line)
    return "\n".join(lines)


def _anchor(rule: type[Rule]) -> str:
    return rule.url().rsplit("#", 1)[1]


def tier(rule: type[Rule]) -> str:
    """Where the rule runs: by default, only with --preview, or by default with some paths
    left to --preview (docs/triage.md has the precision that decides it)."""
    if rule.preview:
        return "Preview: runs only with `--preview` (its triaged precision is below 0.9)."
    if rule.preview_paths:
        return f"On by default; {rule.preview_paths} only with `--preview` (triaged precision below 0.9)."
    return ""


def render() -> str:
    rules = all_rules()
    out = ["# amplint rules", "",
           "Generated from each rule's own documentation by `amplint rules --format markdown`; "
           "`amplint rule CODE` prints one rule.", "",
           "| code | name | fix | preview | finds |", "|---|---|---|---|---|"]
    for r in rules:
        summary = r.summary.replace("|", "\\|")
        preview = "rule" if r.preview else "some paths" if r.preview_paths else ""
        out.append(f"| [{r.code}](#{_anchor(r)}) | {r.name} | {'yes' if r.fixable else ''} | {preview} | {summary} |")
    for rule in rules:
        out += ["", f"## {rule.code} {rule.name}", "", rule.summary, "",
                "Fix available." if rule.fixable else "No fix.", *(["", tier(rule)] if tier(rule) else []),
                "", _demoted(rule.documentation())]
    out += ["", "## Codes of the engine", ""]
    out += [f"- **{code} {name}**: {meaning}" for code, (name, meaning) in ENGINE_CODES.items()]
    return "\n".join(out) + "\n"
