"""Check a set of paths: discovery, reading, linting, writing fixes safely."""

from __future__ import annotations

import ast
import difflib
import gc
import multiprocessing
import os
import zlib
from collections import Counter
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator


from ..policy import PolicyError, loader, user_tables_digest
from . import noqa, notebook, project_index, source as source_io
from .cache import Cache
from .config import Config, ConfigError, Resolver
from .diagnostics import INTERNAL_ERROR, SYNTAX_ERROR, Diagnostic, Location
from .discovery import python_files
from .outline import Outline
from .rule import Rule
from .runner import FileResult, TextMatch, lint_source, prefilter

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
    show_fixes: bool = False  # with fix: count the fixes applied per file and rule
    add_noqa: bool = False  # append `# noqa: CODE` to each line with a finding, instead of fixing
    preview: bool = False  # report preview paths too: set from each file's configuration

    @property
    def writes(self) -> bool:
        return self.fix or self.diff or self.add_noqa


# Below this many files a process pool costs more than it saves (the pre-commit case).
_POOL_MIN_FILES = 64


@dataclass
class Report:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files_checked: int = 0
    files_from_cache: int = 0  # of those, answered by the result cache
    files_fixed: int = 0
    fixes_applied: int = 0
    internal_errors: int = 0
    diffs: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # the text findings point into
    fixed_text: str | None = None  # from stdin with --fix: the text to hand back
    fixed_by_file: dict[str, dict[str, int]] = field(default_factory=dict)  # --show-fixes: path -> code -> n
    noqa_added: int = 0  # --add-noqa: codes added,
    noqa_lines: int = 0  # on so many lines,
    noqa_files: int = 0  # of so many files


@dataclass
class Checked(FileResult):
    """A file's result with what --show-fixes and --add-noqa report."""

    fixed_codes: dict[str, int] = field(default_factory=dict)
    noqa_added: int = 0
    noqa_lines: int = 0


@dataclass
class _Profile:
    """What the files under one configuration share: their rules and their cache."""

    config: Config
    rules: list[type[Rule]]
    cache: Cache | None
    options: Options  # the run's, with the configuration's preview


def policy_loader(config: Config):
    return loader(config.device, config.torch_version, config.policies)


def _profile(config: Config, rules: list[type[Rule]], options: Options) -> _Profile:
    if any(r.uses_policy for r in rules):
        try:
            policy_loader(config)()
        except PolicyError as exc:
            where = f"{config.source} [tool.amplint]" if config.source else "configuration"
            raise ConfigError(f"{where}: device / torch-version: {exc}") from None
    # Runs that write files are not cached; plain checks are, in each project's root.
    cache = None
    if options.cache and not options.writes:
        settings = {"device": config.device, "torch_version": config.torch_version,
                    "prefilter": options.use_prefilter, "preview": config.preview}
        if config.policies is not None:  # the project's own tables: what they hold
            settings["policies"] = user_tables_digest(config.policies)
        cache = Cache(config.root, [r.code for r in rules], settings)
        project_index.keep_summaries(cache.folder / "index", cache.linter)
    return _Profile(config, rules, cache, replace(options, preview=config.preview))


def check_paths(paths: list[Path], config: Config | Resolver, rules: list[type[Rule]] | None,
                options: Options) -> Report:
    """Check the files under ``paths``: with a ``Config`` and ``rules``, those for every file;
    with a ``Resolver``, each file with the configuration of its own project (and the rules
    it selects)."""
    resolver = config if isinstance(config, Resolver) else Resolver(config, rules=rules)
    project_index.forget()  # a run reads the project's other files as they are now
    project_index.name_folders(paths)
    report = Report()
    profiles: list[_Profile] = []
    profile_of: dict[int, int] = {}  # id(config) -> index in profiles

    def profile_index(file_config: Config) -> int:
        if id(file_config) not in profile_of:
            profile_of[id(file_config)] = len(profiles)
            profiles.append(_profile(file_config, resolver.rules_for(file_config), options))
        return profile_of[id(file_config)]

    if resolver.fixed is not None:  # its settings are checked before a file is read
        profile_index(resolver.fixed)
    tasks, unreadable, real_folders = [], [], {}
    for path in python_files(paths, resolver, unreadable, options.force_exclude, real_folders):
        file_config = resolver.for_file(path)
        key = profile_index(file_config)
        ignored = file_config.ignored_for(path)
        rules_here = profiles[key].rules
        if ignored:
            rules_here = [r for r in rules_here if not any(r.code.startswith(i) for i in ignored)]
        tasks.append((path, rules_here, key))
    if options.jobs > 1 and len(tasks) >= _POOL_MIN_FILES:
        results = _in_pool(tasks, options, profiles, real_folders)
    else:
        loaders = [policy_loader(p.config) for p in profiles]
        results = (check_file(path, file_rules, profiles[key].options, loaders[key], profiles[key].cache)
                   for path, file_rules, key in tasks)
    for result in results:
        report.files_checked += 1
        report.files_from_cache += result.from_cache
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
        if isinstance(result, Checked):
            if result.fixed_codes:
                report.fixed_by_file[result.path] = result.fixed_codes
            report.noqa_added += result.noqa_added
            report.noqa_lines += result.noqa_lines
            report.noqa_files += bool(result.noqa_lines)
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
    project_index.new_run()
    options = replace(options, preview=config.preview)
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
                             use_prefilter=options.use_prefilter, preview=options.preview)
        report.fixed_text = result.source
        if options.fix or options.diff:
            report.fixes_applied, report.files_fixed = result.fixes_applied, int(bool(result.fixes_applied))
        if options.show_fixes and options.fix and result.fixes_applied:
            before = lint_source(name, text.text, file_rules, policy_loader=policy_loader(config),
                                 use_prefilter=options.use_prefilter, preview=options.preview)
            fixed = _fixed_codes(before.diagnostics, result.diagnostics, options.unsafe_fixes)
            if fixed:
                report.fixed_by_file[name] = fixed
        if options.diff and result.source != text.text:
            report.diffs.append(_unified_diff(text.text, result.source, name))
    report.diagnostics = sorted(result.diagnostics, key=lambda d: d.sort_key)
    report.internal_errors = result.internal_errors
    if result.diagnostics:
        report.sources[name] = result.source
    return report


def check_buffer(data: bytes, name: str, resolver: Resolver, options: Options) -> Report:
    """An editor's buffer shown as ``name`` (`--stdin-filename`, the language server; `-`: no
    name): ``check_stdin`` with the configuration of the nearest folder of its path that
    exists (the current one for `-`), and the rules it selects."""
    folder = Path(os.path.abspath(name)).parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    config = resolver.for_folder(folder)
    return check_stdin(data, name, config, resolver.rules_for(config), options)


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


def _in_pool(tasks, options: Options, profiles: list[_Profile], real_folders: dict[str, str]
             ) -> Iterator[FileResult]:
    """Files spread over processes in chunks of one project each; results come back in the
    order of ``tasks``. What the checks read of a project is read once, by one process
    (``_read_project_in_worker``), which also settles the files it can from what it read; the
    rest goes with the project's facts in chunks, handed out as soon as it is read: processes
    done reading check the files of projects already read while another still reads a large
    one. ``real_folders``: discovery's folders, resolved."""
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    # Most files are settled by the process that reads their project: the chunks hold those
    # that need a check, and are kept small enough that the last ones end together.
    size = max(1, len(tasks) // (options.jobs * 128))
    roots, ordered = project_index.projects_of((path for path, _, _ in tasks), real_folders)
    members: dict[Path | None, list[int]] = {}
    for index, root in enumerate(roots):
        members.setdefault(root, []).append(index)
    worker_options = Options(**{**options.__dict__, "progress": None})  # a callback stays here
    shared = [(p.config, p.cache) for p in profiles]  # each worker's options take the config's preview
    # Per task: its chunk and its place there, or its result.
    placed: list[tuple[Future, int] | FileResult | None] = [None] * len(tasks)
    with ProcessPoolExecutor(options.jobs, mp_context=context, initializer=_init_worker,
                             initargs=(shared, project_index.named_folders())) as pool:

        def hand_out(indices: list[int], facts: dict, matched: dict[int, TextMatch]) -> None:
            for start in range(0, len(indices), size):
                chunk = indices[start:start + size]
                future = pool.submit(_check_in_worker, [(*tasks[i], matched.get(i)) for i in chunk],
                                     worker_options, facts)
                for place, index in enumerate(chunk):
                    placed[index] = (future, place)

        reading = {pool.submit(_read_project_in_worker, root, {i: tasks[i] for i in members[root]},
                               worker_options): root for root in ordered}
        if None in members:
            hand_out(members[None], {}, {})
        for done in as_completed(reading):
            facts, checked, matched = done.result()
            for index, result in checked.items():
                placed[index] = result
            hand_out([i for i in members[reading[done]] if i not in checked], facts, matched)
        for entry in placed:
            yield entry if isinstance(entry, FileResult) else entry[0].result()[entry[1]]


_worker_state: list[tuple] = []  # per profile: (policy loader, cache, preview)


def _init_worker(profiles: list[tuple[Config, Cache | None]], named: frozenset[Path]) -> None:
    global _worker_state
    project_index.name_folders(named)
    _worker_state = [(policy_loader(config), cache, config.preview) for config, cache in profiles]


def _check_here(path: Path, rules: list[type[Rule]], options: Options, key: int,
                text_match: TextMatch | None = None) -> FileResult:
    """``check_file`` in a worker, with the state of the file's profile."""
    load, cache, preview = _worker_state[key]
    return check_file(path, rules, replace(options, preview=preview), load, cache, text_match)


def _read_project_in_worker(root: Path, tasks: dict[int, tuple], options: Options) -> tuple[dict, dict, dict]:
    """A project's facts (``project_index.project_facts``), the results of the files this
    process can settle with what reading them left it (those it parsed, checked from the
    outlines it kept, and those in whose bytes, already read, the prefilter's text stage finds
    nothing to check: most files), and for the rest, left to the chunks, what that stage found."""
    facts = project_index.project_facts(root)
    parsed = project_index.parsed_here()
    names = {path.name for path in parsed}
    settled = {index: _check_here(path, rules, options, key)
               for index, (path, rules, key) in tasks.items()
               if path.name in names and Path(os.path.realpath(path)) in parsed}
    Outline.forget_kept()  # those no check took
    matched: dict[int, TextMatch] = {}
    with collector_paused():
        for index, (path, rules, key) in tasks.items():
            data = None if index in settled else project_index.bytes_read(Path(os.path.abspath(path)))
            load, cache, preview = _worker_state[key]
            result = None if data is None else _settled_by_text(path, data, rules, replace(options, preview=preview),
                                                                 load, cache)
            if isinstance(result, TextMatch):
                matched[index] = result
            elif result is not None:
                settled[index] = result
    return facts, settled, matched


def _check_in_worker(chunk, options: Options, facts: dict) -> list[FileResult]:
    project_index.adopt(facts)
    return [_check_here(path, rules, options, key, text_match)
            for path, rules, key, text_match in chunk]


def _unreadable(display: str, why: str) -> FileResult:
    result = FileResult(display, [_io_diagnostic(display, f"cannot check {display}: {why}")])
    result.internal_errors = 1
    return result


def _io_diagnostic(path: str, message: str) -> Diagnostic:
    return Diagnostic(INTERNAL_ERROR[0], "io-error", message, path, Location(1, 1), Location(1, 1))


@contextmanager
def collector_paused():
    """Python's cycle collector paused while one file is checked: its tree and the models the
    rules build on it are many tracked objects without a cycle among them, which collections
    would walk again and again as they grow (in a language server, with what it keeps between
    checks). What cycles the file leaves behind are freed by the collection the next
    allocation triggers."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_file(path: Path, rules: list[type[Rule]], options: Options, load, cache=None,
               text_match: TextMatch | None = None) -> FileResult:
    """``text_match``: what the prefilter's text stage found in the file's bytes (if they are
    still those)."""
    with collector_paused():
        return _check_file(path, rules, options, load, cache, text_match)


def printable(path: Path) -> str:
    """The path as it can be printed: bytes of a name that are not UTF-8 shown as U+FFFD."""
    return os.fsencode(path).decode("utf-8", errors="replace")


def _from_cache(cache: Cache | None, data: bytes, codes: list[str], display: str,
                text: source_io.SourceText) -> FileResult | None:
    cached = None if cache is None else cache.get(data, codes, display)
    return None if cached is None else FileResult(display, cached, source=text.text if cached else None,
                                                  from_cache=True)


def _settled_by_text(path: Path, data: bytes, rules: list[type[Rule]], options: Options, load,
                     cache) -> FileResult | TextMatch | None:
    """``check_file``'s result for a file's ``data`` when the cache has it, or when the
    prefilter's text stage leaves no rule to run on it; else what that stage found (a full
    check is needed), or None for a notebook or bytes that do not decode."""
    if not options.use_prefilter or notebook.is_notebook(path):
        return None
    display = printable(path)
    try:
        text = source_io.decode(data)
    except source_io.SourceError:
        return None
    codes = [r.code for r in rules]
    cached = _from_cache(cache, data, codes, display, text)
    if cached is not None:
        return cached
    hints = project_index.ProjectHints(display)
    found = prefilter(tuple(rules), options.preview).matching(text.text, hints)
    if found:
        return TextMatch(zlib.crc32(data), tuple(found), frozenset(hints.read))
    result = FileResult(display, dependencies=set(hints.read))
    if cache is not None:
        cache.put(data, codes, result.diagnostics, result.dependencies)
    return result


def _check_file(path: Path, rules: list[type[Rule]], options: Options, load, cache,
                text_match: TextMatch | None) -> FileResult:
    display = printable(path)
    try:
        data = source_io.read_file(path)
        text = None if notebook.is_notebook(path) else source_io.decode(data)
    except OSError as exc:
        return _unreadable(display, f"cannot read: {exc.strerror or exc}")
    except source_io.SourceError as exc:
        return _unreadable(display, str(exc))
    if text is None:  # a Jupyter notebook: its code cells
        result = notebook.check_file(path, display, data, rules, options, load, cache)
        if options.show_fixes and options.fix and not options.diff and result.fixes_applied:
            before, _ = notebook.check_data(display, data, rules, replace(options, fix=False, progress=None), load)
            result = Checked(**vars(result), fixed_codes=_fixed_codes(
                before.diagnostics, result.diagnostics, options.unsafe_fixes))
        return result
    codes = [r.code for r in rules]
    cached = _from_cache(cache, data, codes, display, text)
    if cached is not None:
        return cached
    fixing = options.fix or options.diff
    if text_match is not None and text_match.checksum != zlib.crc32(data):
        text_match = None  # changed since
    result = lint_source(display, text.text, rules, fix=fixing, unsafe=options.unsafe_fixes,
                         policy_loader=load, use_prefilter=options.use_prefilter, text_match=text_match,
                         preview=options.preview)
    if cache is not None and not result.internal_errors:
        cache.put(data, codes, result.diagnostics, result.dependencies)
    if fixing and result.source is not None and result.source != text.text:
        if options.diff:
            result.diff = _unified_diff(text.text, result.source, display)
        else:
            try:
                source_io.write_atomically(path, text.encode(result.source), expected=data)
            except (OSError, UnicodeEncodeError) as exc:
                # Nothing was written: the findings are those of the text on disk.
                result = lint_source(display, text.text, rules, policy_loader=load,
                                     use_prefilter=options.use_prefilter, preview=options.preview)
                result.diagnostics.append(_io_diagnostic(display, f"cannot write fixes to {display}: {exc}"))
                result.internal_errors += 1
            else:
                if options.show_fixes:
                    before = lint_source(display, text.text, rules, policy_loader=load,
                                         use_prefilter=options.use_prefilter, preview=options.preview)
                    result = Checked(**vars(result), fixed_codes=_fixed_codes(
                        before.diagnostics, result.diagnostics, options.unsafe_fixes))
    elif options.add_noqa and result.diagnostics:
        result = _add_noqa(path, display, data, text, result)
    # The text the findings point into goes back with them (and only with them).
    result.source = (result.source or text.text) if result.diagnostics else None
    return result


def _fixed_codes(before: list[Diagnostic], after: list[Diagnostic], unsafe: bool) -> dict[str, int]:
    """--show-fixes: per rule, how many of the findings whose fix this run could apply are gone
    after it (a fix that was not applied leaves its finding, and its fix, in place)."""
    def applicable(d: Diagnostic) -> bool:
        return d.fix is not None and (unsafe or d.fix.applicability == "safe")

    fixable_before = Counter(d.code for d in before if applicable(d))
    fixable_after = Counter(d.code for d in after if applicable(d))
    total_before, total_after = Counter(d.code for d in before), Counter(d.code for d in after)
    fixed = {code: min(n - fixable_after[code], total_before[code] - total_after[code])
             for code, n in sorted(fixable_before.items())}
    return {code: n for code, n in fixed.items() if n > 0}


_UNSUPPRESSIBLE = (SYNTAX_ERROR[0], INTERNAL_ERROR[0])
_UNUSED_NOQA = "AMP100"  # a finding about a `# noqa` itself: adding its code there would hide it


def _add_noqa(path: Path, display: str, data: bytes, text: source_io.SourceText, result: FileResult) -> Checked:
    """--add-noqa: ``# noqa: CODE`` on the line of each finding, written as --fix writes (same
    encoding, BOM, line endings and permissions; atomically; only over the text that was
    checked). A file with a syntax or internal error is left alone. The findings left are
    those on lines that cannot take a comment, and AMP100's."""
    checked = Checked(**vars(result))
    if any(d.code in _UNSUPPRESSIBLE for d in result.diagnostics):
        return checked
    wanted: dict[int, set[str]] = {}
    for d in result.diagnostics:
        if d.code != _UNUSED_NOQA:
            wanted.setdefault(d.location.row, set()).add(d.code)
    added = noqa.add_codes(text.text, wanted)
    if not added.lines:
        return checked
    try:
        compile(added.text, display, "exec", ast.PyCF_ONLY_AST)  # never write code that does not parse
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        checked.diagnostics.append(_io_diagnostic(
            display, f"adding noqa comments to {display} would produce code that does not parse "
            f"({type(exc).__name__}); nothing was written"))
        checked.internal_errors += 1
        return checked
    try:
        source_io.write_atomically(path, text.encode(added.text), expected=data)
    except (OSError, UnicodeEncodeError) as exc:
        checked.diagnostics.append(_io_diagnostic(display, f"cannot write noqa comments to {display}: {exc}"))
        checked.internal_errors += 1
        return checked
    checked.diagnostics = [d for d in result.diagnostics
                           if d.code == _UNUSED_NOQA or d.location.row in added.refused]
    checked.source = added.text
    checked.noqa_added, checked.noqa_lines = added.codes, added.lines
    return checked
