"""`amplint trace` / `python -m amplint.trace`: the click command. `amplint check` never imports
this module (cli.py imports it inside the `trace` command only), so the linter stays torch-free."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click


_NEEDS_TORCH = "amplint: error: amplint trace needs PyTorch (pip install torch)"


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
@click.option("--simulate", type=click.Choice(["cuda"]),
              help="Instead of running a script: one forward and backward of --model on --input under this "
                   "device's autocast policy, on simulated tensors (no GPU needed).")
@click.option("--model", "model_spec", metavar="PKG.MODULE:FACTORY",
              help="With --simulate: the model, made by calling FACTORY (imported from the current folder).")
@click.option("--input", "input_specs", multiple=True, metavar="SPEC",
              help="With --simulate: an example input, e.g. 'randn(8,3,224,224)' or 'randint(1000, (8,128))'; "
                   "repeat for more arguments.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16"]), default="float16", show_default=True,
              help="With --simulate: the autocast dtype.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def trace(steps, output_format, select, ignore, report_file, simulate, model_spec, input_specs, dtype, command):
    """Run a training script with AMP instrumentation: `amplint trace -- python train.py ARGS`.

    Reports AMP mistakes seen at run time (the static rules' codes, at your file:line), the loss
    scale and skipped steps per optimizer step, and each module's dtypes. Exit 1 with findings,
    0 without, the program's own exit code when it failed.

    `amplint trace --simulate cuda --model pkg.module:factory --input 'randn(8,3,224,224)'` runs
    the model under CUDA's autocast policy without a GPU: the dtype map, and AMP003/AMP008."""
    if simulate:
        if command or not model_spec or not input_specs:
            raise click.UsageError("--simulate takes --model and --input, and no command")
        sys.exit(run_simulation(model_spec, list(input_specs), dtype=dtype, output_format=output_format,
                                select=select, ignore=ignore, report_file=report_file))
    if not command:
        raise click.UsageError("give the command to trace (`amplint trace -- python train.py`), or --simulate")
    sys.exit(run_command(list(command), steps=steps, output_format=output_format, select=select,
                         ignore=ignore, report_file=report_file))


def _rules(select, ignore):
    """The configuration and its rules with the command line's --select/--ignore; None, with
    the error said, when either is invalid."""
    from ..engine import config as config_mod

    try:
        # What a run shows is no guess: the preview tier, set by the static rules' precision,
        # does not apply to the trace.
        config = dataclasses.replace(config_mod.load(Path.cwd()), preview=True)
        return config, config.rules(
            select=config_mod.validate_codes(_codes(select), "--select") if select is not None else None,
            ignore=config_mod.validate_codes(_codes(ignore) or [], "--ignore"))
    except config_mod.ConfigError as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        return None


def run_simulation(model_spec, input_specs, dtype="float16", output_format="text", select=None, ignore=None,
                   report_file=None) -> int:
    configured = _rules(select, ignore)
    if configured is None:
        return 2
    config, rules = configured
    try:
        import torch

        from . import simulate as sim
    except ImportError:
        click.echo(_NEEDS_TORCH, err=True)
        return 2
    try:
        inputs = [sim.parse_input(spec) for spec in input_specs]
        model = sim.load_model(model_spec)
    except sim.SimulationError as exc:
        click.echo(f"amplint: error: {exc}", err=True)
        return 2
    described = " ".join(["amplint trace --simulate cuda --model", model_spec,
                          *(f"--input '{spec}'" for spec in input_specs)])
    result = sim.simulate(model, *inputs, dtype=getattr(torch, dtype), select={r.code for r in rules},
                          torch_version=config.torch_version, description=described)
    return _shown(result, sys.stdout, output_format, report_file, sim.text, sim.full_json,
                  bool(result.tracer.findings))


def _shown(result, stdout, output_format, report_file, as_text, as_json, found: bool) -> int:
    """Show what a run found (on ``stdout``, in the format asked) and write the report file;
    the exit status."""
    from . import report

    if result.error:
        sys.stderr.write(result.error)
    render = {"json": report.findings_json, "html": report.html_page}.get(output_format, as_text)
    stdout.write(render(result))
    stdout.flush()
    if report_file is not None and not _write_report(report_file, result, as_json):
        return 2
    click.echo(report.summary(result), err=True)
    return result.exit_code or (1 if found else 0)


def _write_report(report_file: Path, result, as_json) -> bool:
    from . import report

    try:
        as_page = report_file.suffix.lower() in (".html", ".htm")
        report_file.write_text((report.html_page if as_page else as_json)(result), encoding="utf-8")
    except OSError as exc:
        click.echo(f"amplint: error: cannot write {report_file}: {exc.strerror or exc}", err=True)
        return False
    return True


def run_command(command, steps=3, output_format="text", select=None, ignore=None, report_file=None) -> int:
    if command and command[0] == "--":
        command = command[1:]
    configured = _rules(select, ignore)
    if configured is None:
        return 2
    config, rules = configured
    try:
        from .tracer import Tracer  # imports torch (quietly about numpy's absence)
    except ImportError:
        click.echo(_NEEDS_TORCH, err=True)
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
    return _shown(result, stdout, output_format, report_file, report.text, report.full_json, bool(tracer.findings))
