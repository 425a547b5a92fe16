"""Check a set of paths: discovery, reading, linting, writing fixes safely."""

from __future__ import annotations

import difflib
import gc
import multiprocessing
import os
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..policy import PolicyError, loader
from . import notebook, source as source_io
from .cache import Cache
from .config import Config, ConfigError
from .diagnostics import Diagnostic, Location
from .discovery import python_files
from .rule import Rule
from .runner import INTERNAL_ERROR, FileResult, lint_source

@dataclass
class Options:
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    force_exclude: bool = False
    use_prefilter: bool = True
    jobs: int = 1
    cache: bool = True
    progress: Callable[[int, int], None] | None = None  # (files done, files in all)


# Below this many files a process pool costs more than it saves (the pre-commit case).
_POOL_MIN_FILES = 64


@dataclass
class Report:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files_checked: int = 0
    files_fixed: int = 0
    fixes_applied: int = 0
    internal_errors: int = 0
    diffs: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # the text findings point into
    fixed_text: str | None = None  # from stdin with --fix: the text to hand back


def policy_loader(config: Config):
    return loader(config.device, config.torch_version)


def check_paths(paths: list[Path], config: Config, rules: list[type[Rule]], options: Options) -> Report:
    report = Report()
    load = policy_loader(config)
    if any(r.uses_policy for r in rules):
        try:
            load()
        except PolicyError as exc:
            where = f"{config.source} [tool.amplint]" if config.source else "configuration"
            raise ConfigError(f"{where}: device / torch-version: {exc}") from None
    tasks, unreadable = [], []
    for path in python_files(paths, config, unreadable, options.force_exclude):
        ignored = config.ignored_for(path)
        tasks.append((path, [r for r in rules if not any(r.code.startswith(i) for i in ignored)]))
    # Fixing writes files; only plain checks are cached.
    cache = None
    if options.cache and not (options.fix or options.diff):
        cache = Cache(config.root, [r.code for r in rules],
                      {"device": config.device, "torch_version": config.torch_version,
                       "prefilter": options.use_prefilter})
    if options.jobs > 1 and len(tasks) >= _POOL_MIN_FILES:
        results = _in_pool(tasks, options, config, cache)
    else:
        results = (check_file(path, file_rules, options, load, cache) for path, file_rules in tasks)
    for result in results:
        report.files_checked += 1
        if options.progress is not None:
            options.progress(report.files_checked, len(tasks))
        report.diagnostics.extend(result.diagnostics)
        if result.diagnostics:
            report.sources[result.path] = result.source
        report.internal_errors += result.internal_errors
        report.fixes_applied += result.fixes_applied
        report.files_fixed += bool(result.fixes_applied)
        if result.diff:
            report.diffs.append(result.diff)
    for folder, why in unreadable:
        result = _unreadable(printable(folder), why)
        report.diagnostics.extend(result.diagnostics)
        report.internal_errors += result.internal_errors
    report.diagnostics.sort(key=lambda d: d.sort_key)
    return report


def check_stdin(data: bytes, name: str, config: Config, rules: list[type[Rule]], options: Options) -> Report:
    """Source read from stdin (an editor's buffer), shown as ``name``; per-file-ignores apply
    to that name. With fixes, the report's ``fixed_text`` is the text to hand back."""
    report = Report(files_checked=1)
    ignored = config.ignored_for(Path(name))
    file_rules = [r for r in rules if not any(r.code.startswith(i) for i in ignored)]
    if notebook.is_notebook(name):
        return _notebook_from_stdin(report, data, name, file_rules, config, options)
    try:
        text = source_io.decode(data)
    except source_io.SourceError as exc:
        result = _unreadable(name, str(exc))
    else:
        result = lint_source(name, text.text, file_rules, fix=options.fix or options.diff,
                             unsafe=options.unsafe_fixes, policy_loader=policy_loader(config),
                             use_prefilter=options.use_prefilter)
        report.fixed_text = result.source
        if options.fix or options.diff:
            report.fixes_applied, report.files_fixed = result.fixes_applied, int(bool(result.fixes_applied))
        if options.diff and result.source != text.text:
            report.diffs.append(_unified_diff(text.text, result.source, name))
    report.diagnostics = sorted(result.diagnostics, key=lambda d: d.sort_key)
    report.internal_errors = result.internal_errors
    if result.diagnostics:
        report.sources[name] = result.source
    return report


def _notebook_from_stdin(report: Report, data: bytes, name: str, rules: list[type[Rule]], config: Config,
                         options: Options) -> Report:
    """``check_stdin`` for a notebook's JSON: with fixes, ``fixed_text`` is the fixed notebook."""
    result, fixed = notebook.check_data(name, data, rules, options, policy_loader(config))
    report.fixed_text = None if fixed is None else fixed.decode("utf-8")
    report.fixes_applied, report.files_fixed = result.fixes_applied, int(bool(result.fixes_applied))
    report.diffs += [result.diff] if result.diff else []
    report.diagnostics = sorted(result.diagnostics, key=lambda d: d.sort_key)
    report.internal_errors = result.internal_errors
    if result.diagnostics:
        report.sources[name] = result.source
    return report


def _unified_diff(before: str, after: str, display: str) -> str:
    return "".join(difflib.unified_diff(
        source_io.split_lines(before, keepends=True), source_io.split_lines(after, keepends=True),
        # git's prefixes; an absolute path keeps one slash (`a/tmp/x.py`), as git's own
        fromfile=f"a/{display.lstrip('/')}", tofile=f"b/{display.lstrip('/')}"))


def _in_pool(tasks, options: Options, config: Config, cache) -> Iterator[FileResult]:
    """Files spread over processes in chunks; results come back in the order of ``tasks``."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    chunk = max(1, len(tasks) // (options.jobs * 32))
    worker_options = Options(**{**options.__dict__, "progress": None})  # a callback stays here
    with ProcessPoolExecutor(options.jobs, mp_context=multiprocessing.get_context(method),
                             initializer=_init_worker, initargs=(config, cache)) as pool:
        yield from pool.map(_check_in_worker, tasks, [worker_options] * len(tasks), chunksize=chunk)


_worker_state: tuple = (None, None)


def _init_worker(config: Config, cache) -> None:
    global _worker_state
    _worker_state = (policy_loader(config), cache)


def _check_in_worker(task, options: Options) -> FileResult:
    path, rules = task
    return check_file(path, rules, options, *_worker_state)


def _unreadable(display: str, why: str) -> FileResult:
    result = FileResult(display, [_io_diagnostic(display, f"cannot check {display}: {why}")])
    result.internal_errors = 1
    return result


def _io_diagnostic(path: str, message: str) -> Diagnostic:
    return Diagnostic(INTERNAL_ERROR[0], "io-error", message, path, Location(1, 1), Location(1, 1))


@contextmanager
def _collection_after():
    """Python's cycle collector paused while one file is checked: a libcst tree is a million
    tracked objects without a cycle among them, and collections that walk it again and again
    as it is built cost a fifth of a whole run. What cycles the file leaves behind are freed
    by the collection the next allocation triggers."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_file(path: Path, rules: list[type[Rule]], options: Options, load, cache=None) -> FileResult:
    with _collection_after():
        return _check_file(path, rules, options, load, cache)


def printable(path: Path) -> str:
    """The path as it can be printed: bytes of a name that are not UTF-8 shown as U+FFFD."""
    return os.fsencode(path).decode("utf-8", errors="replace")


def _check_file(path: Path, rules: list[type[Rule]], options: Options, load, cache) -> FileResult:
    display = printable(path)
    try:
        data = source_io.read_file(path)
        text = None if notebook.is_notebook(path) else source_io.decode(data)
    except OSError as exc:
        return _unreadable(display, f"cannot read: {exc.strerror or exc}")
    except source_io.SourceError as exc:
        return _unreadable(display, str(exc))
    if text is None:  # a Jupyter notebook: its code cells
        return notebook.check_file(path, display, data, rules, options, load, cache)
    codes = [r.code for r in rules]
    if cache is not None:
        cached = cache.get(data, codes, display)
        if cached is not None:
            return FileResult(display, cached, source=text.text if cached else None)
    fixing = options.fix or options.diff
    result = lint_source(display, text.text, rules, fix=fixing, unsafe=options.unsafe_fixes,
                         policy_loader=load, use_prefilter=options.use_prefilter)
    if cache is not None and not result.internal_errors:
        cache.put(data, codes, result.diagnostics)
    if fixing and result.source is not None and result.source != text.text:
        if options.diff:
            result.diff = _unified_diff(text.text, result.source, display)
        else:
            try:
                source_io.write_atomically(path, text.encode(result.source), expected=data)
            except (OSError, UnicodeEncodeError) as exc:
                # Nothing was written: the findings are those of the text on disk.
                result = lint_source(display, text.text, rules, policy_loader=load,
                                     use_prefilter=options.use_prefilter)
                result.diagnostics.append(_io_diagnostic(display, f"cannot write fixes to {display}: {exc}"))
                result.internal_errors += 1
    # The text the findings point into goes back with them (and only with them).
    result.source = (result.source or text.text) if result.diagnostics else None
    return result
