"""Run a user's script or module in this process, under a Tracer (runpy; never a shell)."""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field

from .tracer import Tracer, TraceStop, _is_library


@dataclass
class TraceResult:
    tracer: Tracer
    exit_code: int  # the program's own: 0 when it ended (or was stopped) cleanly
    stopped: bool = False  # stopped by amplint after the requested steps
    error: str | None = None  # the traceback text when it failed
    argv: list[str] = field(default_factory=list)

    @property
    def command_line(self) -> str:
        return " ".join(["python", *self.argv])

    @property
    def ending(self) -> str:
        steps = len(self.tracer.steps)
        return (f"stopped after {steps} optimizer step{'s' * (steps != 1)}" if self.stopped
                else f"the program ended (exit code {self.exit_code}) after {steps} optimizer "
                     f"step{'s' * (steps != 1)}")


def split_command(command: list[str]) -> tuple[str | None, list[str]]:
    """``python train.py ARGS`` / ``python -m pkg ARGS`` / ``train.py ARGS`` -> (module or None, argv)."""
    args = list(command)
    if args and os.path.basename(args[0]).startswith("python") and not args[0].endswith(".py"):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] != "-m":
            args = args[1:]  # interpreter flags (-u, -O, ...): this interpreter runs it as it is
    if len(args) >= 2 and args[0] == "-m":
        return args[1], args[1:]
    if not args:
        raise ValueError("no script to run: give `python train.py ARGS` or `train.py ARGS`")
    return None, args


def _user_traceback(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and _is_library(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next  # runpy's and amplint's own frames
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def run(command: list[str], tracer: Tracer, stdout=None) -> TraceResult:
    """Run ``command`` (see ``split_command``) under ``tracer``; ``stdout``: where the program's
    standard output goes (None: where it is)."""
    module, argv = split_command(command)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv[:]
    if module is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    else:
        sys.path.insert(0, os.getcwd())
    result = TraceResult(tracer, 0, argv=argv)
    redirect = contextlib.redirect_stdout(stdout) if stdout is not None else contextlib.nullcontext()
    try:
        with redirect, tracer:
            try:
                if module is None:
                    runpy.run_path(argv[0], run_name="__main__")
                else:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
            except TraceStop:
                result.stopped = True
            except SystemExit as exc:
                code = exc.code
                result.exit_code = 0 if code is None else code if isinstance(code, int) else 1
                if not isinstance(code, (int, type(None))):
                    print(code, file=sys.stderr)
            except BaseException as exc:  # noqa: B036 - the program's own failure, reported as Python would
                tracer.note_exception(exc)
                result.exit_code = 1
                result.error = _user_traceback(exc)
                if isinstance(exc, KeyboardInterrupt):
                    result.exit_code = 130
            tracer.finish()
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
    return result
