"""`amplint trace` / `python -m amplint.trace`: the click command. `amplint check` never imports
this module (cli.py imports it inside the `trace` command only), so the linter stays torch-free."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def _codes(value: str | None) -> list[str] | None:
    return None if value is None else [c for c in value.replace(" ", "").split(",") if c]


@click.command("trace", context_settings={"help_option_names": ["-h", "--help"],
                                          "allow_interspersed_args": False, "ignore_unknown_options": True})
@click.option("--steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Stop the program after this many optimizer steps (0: let it run to its end).")
@click.option("--output-format", type=click.Choice(["text", "json", "html"]), default="text", show_default=True,
              help="json: the findings with `amplint check --output-format json`'s fields on stdout; html: "
                   "the trace as one self-contained page on stdout (the program's own stdout then goes to stderr).")
@click.option("--select", help="Comma-separated codes or prefixes to report (replaces the config's).")
@click.option("--ignore", help="Comma-separated codes or prefixes not to report.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also write the whole trace to this file: as the HTML page when its name ends in .html "
                   "or .htm, otherwise as JSON (findings, steps, dtype map).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace(steps, output_format, select, ignore, report_file, command):
    """Run a training script with AMP instrumentation: `amplint trace -- python train.py ARGS`.

    Reports AMP mistakes seen at run time (the static rules' codes, at your file:line), the loss
    scale and skipped steps per optimizer step, and each module's dtypes. Exit 1 with findings,
    0 without, the program's own exit code when it failed."""
    sys.exit(run_command(list(command), steps=steps, output_format=output_format, select=select,
                         ignore=ignore, report_file=report_file))


def run_command(command, steps=3, output_format="text", select=None, ignore=None, report_file=None) -> int:
    from ..engine import config as config_mod

    if command and command[0] == "--":
        command = command[1:]
    try:
        config = config_mod.load(Path.cwd())
        rules = config.rules(
            select=config_mod.validate_codes(_codes(select), "--select") if select is not None else None,
            ignore=config_mod.validate_codes(_codes(ignore) or [], "--ignore"))
    except config_mod.ConfigError as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        return 2
    try:
        from .tracer import Tracer  # imports torch (quietly about numpy's absence)
    except ImportError:
        click.echo("amplint: error: amplint trace needs PyTorch (pip install torch)", err=True)
        return 2
    from . import report
    from .runner import run, split_command

    try:
        split_command(command)
    except ValueError as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        return 2
    tracer = Tracer(steps=steps or None, codes={r.code for r in rules}, device=config.device,
                    torch_version=config.torch_version)
    stdout = sys.stdout
    result = run(command, tracer, stdout=sys.stderr if output_format in ("json", "html") else None)
    if result.error:
        sys.stderr.write(result.error)
    render = {"json": report.findings_json, "html": report.html_page}.get(output_format, report.text)
    stdout.write(render(result))
    stdout.flush()
    if report_file is not None:
        try:
            as_page = report_file.suffix.lower() in (".html", ".htm")
            report_file.write_text((report.html_page if as_page else report.full_json)(result), encoding="utf-8")
        except OSError as exc:
            click.echo(f"amplint: error: cannot write {report_file}: {exc.strerror or exc}", err=True)
            return 2
    click.echo(report.summary(result), err=True)
    if result.exit_code != 0:
        return result.exit_code
    return 1 if tracer.findings else 0
