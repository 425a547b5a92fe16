"""The command line: thin wrappers that parse options and hand off to the engine or probe."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from . import __version__
from .engine import config as config_mod
from .engine.cache import clean as cache_clean
from .engine.discovery import PathError
from .engine.project import Options, check_buffer, check_paths
from .engine.rule import all_rules, rule_by_code
from .engine.diagnostics import INTERNAL_ERROR
from .output import FORMATS, TERMINAL_FORMATS
from .output import json_format, rules_page
from .output.text import statistics
from .terminal import progress_bar, use_color
from .probe.command import probe


def _codes(value: str | None) -> list[str] | None:
    return None if value is None else [c for c in value.replace(" ", "").split(",") if c]


def _globs(value: str | None) -> list[str] | None:
    return None if value is None else [g.strip() for g in value.split(",") if g.strip()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amplint")
def main():
    """amplint: find and fix automatic-mixed-precision mistakes in PyTorch code."""


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--fix", is_flag=True, help="Apply safe fixes.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix or --diff, also apply unsafe fixes.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff instead of the findings; write "
              "nothing. Exit 1 when there is something to fix.")
@click.option("--select", help="Comma-separated codes or prefixes to enable (replaces the config's).")
@click.option("--ignore", help="Comma-separated codes or prefixes to disable.")
@click.option("--extend-select", help="Comma-separated codes or prefixes to enable in addition.")
@click.option("--output-format", type=click.Choice(list(FORMATS)), default="full", show_default=True,
              help="full: each finding with its source and a caret; concise: one line each.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Colour terminal output (auto: when stdout is a terminal and NO_COLOR is unset).")
@click.option("--statistics", "show_statistics", is_flag=True,
              help="Count findings per rule ([*]: --fix fixes some); JSON with --output-format json.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings remain.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Processes to use (default: the machine's cores).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write .amplint_cache/.")
@click.option("--force-exclude", is_flag=True,
              help="Apply exclude / extend-exclude to files named on the command line too (pre-commit).")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when --fix changed a file, even if nothing remains.")
@click.option("-o", "--output-file", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Write the findings (or the diff) to this file instead of stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Print the findings and nothing else (no summary, no progress bar).")
@click.option("--stdin-filename", help="With `-` as the path (source read from stdin): the file name to show "
              "and to match per-file-ignores against.")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks of internal errors, and how many files the "
              "cache answered.")
@click.option("--config", "config_file", type=click.Path(path_type=Path),
              help="Use this pyproject.toml's [tool.amplint] for every file, instead of each file's nearest "
              "one (its relative patterns then apply from the current folder).")
@click.option("--exclude", help="Comma-separated globs to leave out (replaces the configured exclude, "
              "defaults included).")
@click.option("--extend-exclude", help="Comma-separated globs to leave out, in addition to the configured ones.")
@click.option("--fix-only", is_flag=True, help="Apply fixes as --fix does, and report only what was fixed; "
              "exit 0 unless an error (1 with --exit-non-zero-on-fix when something was fixed).")
@click.option("--show-fixes", is_flag=True, help="With --fix or --fix-only: after the findings, list the fixes "
              "applied per file and rule.")
@click.option("--add-noqa", is_flag=True, help="Append `# noqa: CODE` to each line with a finding (merged with "
              "a noqa comment it has) and say how many; fix nothing.")
@click.option("--preview/--no-preview", default=None, help="Also run the rules, and the paths of rules, whose "
              "triaged precision is still below 0.9 (replaces the configuration's `preview`).")
def check(paths, fix, unsafe_fixes, diff, select, ignore, extend_select, output_format, color,
          show_statistics, exit_zero, jobs, no_cache, force_exclude, exit_non_zero_on_fix, output_file, quiet,
          stdin_filename, verbose, config_file, exclude, extend_exclude, fix_only, show_fixes, add_noqa, preview):
    """Check Python files for AMP mistakes (default: the current folder; `-`: source from stdin)."""
    paths = list(paths) or [Path(".")]
    from_stdin = paths == [Path("-")]
    if add_noqa and (fix or fix_only or diff):
        raise click.UsageError("--add-noqa cannot be combined with --fix, --fix-only or --diff")
    if add_noqa and from_stdin:
        raise click.UsageError("--add-noqa writes files; it cannot be used with source from stdin")
    fix = fix or fix_only
    try:
        overrides = config_mod.Overrides(
            select=config_mod.validate_codes(_codes(select), "--select") if select is not None else None,
            ignore=config_mod.validate_codes(_codes(ignore) or [], "--ignore"),
            extend_select=config_mod.validate_codes(_codes(extend_select) or [], "--extend-select"),
            exclude=_globs(exclude), extend_exclude=_globs(extend_exclude) or [], preview=preview)
        # Each file's nearest pyproject.toml, or with --config that one file for all of them.
        resolver = config_mod.Resolver(config_mod.load_file(config_file) if config_file else None, overrides)
        options = Options(fix=fix, unsafe_fixes=unsafe_fixes, diff=diff, force_exclude=force_exclude,
                          jobs=jobs or os.cpu_count() or 1, cache=not no_cache, show_fixes=show_fixes,
                          add_noqa=add_noqa)
        if from_stdin:
            stdin_data = sys.stdin.buffer.read()
            report = check_buffer(stdin_data, stdin_filename or "-", resolver, options)
        else:
            with contextlib.nullcontext() if quiet else progress_bar("checking", unit="files") as progress:
                options.progress = progress
                report = check_paths(paths, resolver, None, options)
        opened = output_file.open("w", encoding="utf-8") if output_file else None
    except (config_mod.ConfigError, PathError) as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"amplint: error: cannot write {output_file}: {exc.strerror or exc}", err=True)
        sys.exit(2)

    # --fix-only reports what was fixed, not what remains: only errors (exit 2) are shown.
    shown = [d for d in report.diagnostics if d.code == INTERNAL_ERROR[0]] if fix_only else report.diagnostics
    out = opened or sys.stdout
    with opened or contextlib.nullcontext():
        if from_stdin and fix:  # an editor's buffer: the fixed text on stdout, the findings on stderr
            # Text that could not be read goes back as it came: an editor must not lose its buffer.
            click.echo(stdin_data if report.fixed_text is None else report.fixed_text, nl=False, file=out)
            out = sys.stderr
        if diff:  # the diff stands for the findings: those left would point into text never written
            click.echo("".join(report.diffs), nl=False, file=out)
        elif show_statistics:
            show = json_format.render_statistics if output_format == "json" else statistics
            click.echo(show(shown), nl=False, file=out)
        elif output_format in TERMINAL_FORMATS:
            colored = use_color(color, out)
            # click strips ANSI codes when stdout is not a terminal unless told otherwise.
            click.echo(FORMATS[output_format](shown, sources=report.sources, color=colored),
                       nl=False, color=colored, file=out)
        else:
            click.echo(FORMATS[output_format](shown), nl=False, file=out)
        if show_fixes and fix and not diff and report.fixed_by_file and output_format in TERMINAL_FORMATS:
            click.echo(("\n" if shown else "") + _fixes_applied(report), nl=False, file=out)
    if verbose:
        for d in report.diagnostics:
            if d.detail:
                click.echo(f"{d.path}: {d.detail}", err=True)
        if not from_stdin:
            click.echo(f"amplint: {_plural(report.files_checked - report.files_from_cache, 'file')} checked, "
                       f"{report.files_from_cache} answered from the cache", err=True)
    if diff:
        if not quiet:
            click.echo(_diff_summary(report), err=True)
        sys.exit(2 if report.internal_errors else 1 if report.diffs and not exit_zero else 0)
    if add_noqa:
        if not quiet:
            click.echo(_noqa_summary(report), err=True)
        sys.exit(2 if report.internal_errors else 1 if shown and not exit_zero else 0)
    if fix_only:
        if output_format in TERMINAL_FORMATS and not quiet:
            click.echo(_fix_only_summary(report, unsafe_fixes), err=True)
        sys.exit(2 if report.internal_errors else 1 if exit_non_zero_on_fix and report.fixes_applied else 0)
    if output_format in TERMINAL_FORMATS and not quiet:
        click.echo(_summary(report, fix), err=True)
    if report.internal_errors:
        sys.exit(2)
    if exit_non_zero_on_fix and report.fixes_applied:
        sys.exit(1)
    sys.exit(1 if report.diagnostics and not exit_zero else 0)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _diff_summary(report) -> str:
    internal = [d for d in report.diagnostics if d.code == "AMP999"]
    lines = [f"{d.path}:{d.location.row}:{d.location.column}: {d.code} {d.message}" for d in internal]
    if report.fixes_applied:
        lines.append(f"Would fix {_plural(report.fixes_applied, 'finding')} in {_plural(report.files_fixed, 'file')}.")
    else:
        lines.append(f"No fixes to apply ({_plural(report.files_checked, 'file')} checked).")
    remaining = len(report.diagnostics) - len(internal)
    if remaining:
        lines.append(f"{_plural(remaining, 'finding')} would remain (run without --diff to see them).")
    return "\n".join(lines)


def _fixes_applied(report) -> str:
    """--show-fixes: per file, how many findings of each rule the fixes removed."""
    lines = ["Fixes applied:"]
    for path in sorted(report.fixed_by_file):
        lines.append(f"  {path}")
        for code, n in report.fixed_by_file[path].items():
            rule = rule_by_code(code)
            lines.append(f"    {code} {rule.name if rule else ''}: {_plural(n, 'finding')} fixed")
    return "\n".join(lines) + "\n"


def _fix_only_summary(report, unsafe_fixes: bool) -> str:
    if report.fixes_applied:
        line = f"Fixed {_plural(report.fixes_applied, 'finding')} in {_plural(report.files_fixed, 'file')}"
    else:
        line = f"No fixes applied ({_plural(report.files_checked, 'file')} checked)"
    unsafe = sum(d.fix is not None and d.fix.applicability == "unsafe" for d in report.diagnostics)
    if unsafe and not unsafe_fixes:
        line += f" ({unsafe} more fixable with --unsafe-fixes)"
    return line + "."


def _noqa_summary(report) -> str:
    lines = [f"Added {_plural(report.noqa_added, 'noqa code')} on {_plural(report.noqa_lines, 'line')} "
             f"in {_plural(report.noqa_files, 'file')}."]
    left = [d for d in report.diagnostics if d.code != INTERNAL_ERROR[0]]
    if left:
        lines.append(f"{_plural(len(left), 'finding')} left as they were (shown above): in a file that does not "
                     "parse, on a line that cannot take a comment (it ends inside a string or continues with a "
                     "backslash), in a notebook, or AMP100's.")
    return "\n".join(lines)


def _summary(report, fix: bool) -> str:
    n = len(report.diagnostics)
    parts = []
    if fix and report.fixes_applied:
        parts.append(f"Fixed {report.fixes_applied} finding{'s' * (report.fixes_applied != 1)} "
                     f"in {report.files_fixed} file{'s' * (report.files_fixed != 1)}.")
    if n:
        files = len({d.path for d in report.diagnostics})
        safe = sum(d.fix is not None and d.fix.applicability == "safe" for d in report.diagnostics)
        unsafe = sum(d.fix is not None and d.fix.applicability == "unsafe" for d in report.diagnostics)
        line = f"Found {n} finding{'s' * (n != 1)} in {files} file{'s' * (files != 1)}"
        hints = []
        if safe:
            hints.append(f"{safe} fixable with --fix")
        if unsafe:
            hints.append(f"{unsafe} {'more ' if safe else ''}fixable with --fix --unsafe-fixes")
        parts.append(line + (f" ({', '.join(hints)})." if hints else "."))
    elif not parts:
        parts.append(f"All checks passed ({report.files_checked} file{'s' * (report.files_checked != 1)}).")
    return "\n".join(parts)


@main.command()
@click.argument("path", required=False, type=click.Path(path_type=Path))
def clean(path):
    """Remove the result cache (.amplint_cache/) of the project at PATH (default: here)."""
    try:
        root = config_mod.load(path or Path.cwd()).root
    except config_mod.ConfigError as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        sys.exit(2)
    removed = cache_clean(root)
    click.echo(f"removed {root / '.amplint_cache'}" if removed else "no cache to remove", err=True)


@main.command("rule")
@click.argument("code")
def rule_doc(code):
    """Show a rule's documentation."""
    text = rules_page.rule_text(code.upper())
    if text is None:
        click.echo(f"amplint: error: unknown rule code {code!r}", err=True)
        sys.exit(2)
    click.echo(text)


@main.command("rules")
@click.option("--format", "output_format", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="markdown: the whole documentation page (docs/rules.md).")
def rules_list(output_format):
    """List every rule: code, name, whether it can fix, summary."""
    if output_format == "markdown":
        click.echo(rules_page.render(), nl=False)
        return
    rows = [(r.code, r.name, "fix" if r.fixable else "", "preview" if r.preview else "", r.summary)
            for r in all_rules()]
    width = max(len(r[1]) for r in rows)
    for code, name, fix, preview, summary in rows:
        click.echo(f"{code}  {name.ljust(width)}  {fix:3}  {preview:7}  {summary}")


main.add_command(probe)


@main.command()
def server():
    """Run the Language Server (LSP over stdio) for editors: findings as you type, fixes, noqa, docs."""
    from .server.server import serve  # pygls only here: `check` starts without it

    serve()


@main.command("trace", add_help_option=False, context_settings={
    "ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False})
@click.pass_context
def trace(ctx):
    """Run a training script with AMP instrumentation: `amplint trace -- python train.py ARGS`."""
    from .trace.command import trace as command  # imports torch: here only, never for `check`

    command.main(list(ctx.args), prog_name="amplint trace")
