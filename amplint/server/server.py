"""`amplint server`: the linter as a Language Server over stdio.

Findings are published when a document opens, when it is saved, and after each change once
the typing pauses (``DEBOUNCE_SECONDS``), for the latest version only. A document's project
(autocast calls, wrappers, config keys) is read from disk, as a run of `amplint check` reads
it, and kept from one check to the next while the modules and config files read and the
folders listed are unchanged (``project_index.new_run``): saving a file, or a change the
client reports of a watched file, reads it anew and re-checks every open document. Each
finding offers its fix and a `# noqa` comment as quick fixes, and `source.fixAll` applies
every safe fix as `amplint check --fix` does; hovering a finding shows its rule's
documentation.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from .. import __version__
from ..engine import noqa, notebook, project_index
from ..engine.diagnostics import Diagnostic
from ..engine.rule import all_rules
from ..engine.switches import CONFIG_SUFFIXES
from ..engine.diagnostics import INTERNAL_ERROR, SYNTAX_ERROR
from ..output.rules_page import rule_text
from . import lint
from .positions import Text

# Long enough that a burst of changes (a paste, a key held down, a snippet) is checked once.
# A check of a version replaced meanwhile stops before its next rule (``AmplintServer.replaced``).
DEBOUNCE_SECONDS = 0.05
FIX_ALL = types.CodeActionKind.SourceFixAll + ".amplint"
# Codes a `# noqa` cannot take: the engine's own, and AMP100's (its code there would hide it).
_NO_NOQA = {SYNTAX_ERROR[0], INTERNAL_ERROR[0], "AMP100"}
# The engine's codes are documented at the end of the rules' page.
_ENGINE_CODES_URL = all_rules()[0].url().split("#")[0] + "#codes-of-the-engine"


@dataclass
class Findings:
    """A version of a document and what the engine found in it."""

    version: int | None
    text: Text
    diagnostics: list[Diagnostic]
    fixed_text: str | None = None  # the text after every safe fix, once asked for
    published: list[types.Diagnostic] = field(default_factory=list)


def _name(uri: str) -> str:
    """The path the engine is told the buffer has (`-` for one that is no file: no project,
    the current folder's configuration)."""
    path = to_fs_path(uri) if urlparse(uri).scheme == "file" else None
    return path or "-"


def _kind_wanted(kind: str, only: list[str] | None) -> bool:
    # Kinds are hierarchical: asking for "source.fixAll" includes "source.fixAll.amplint".
    return not only or any(kind == o or kind.startswith(o + ".") for o in only)


class AmplintServer(LanguageServer):
    def __init__(self):
        super().__init__("amplint", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Full)
        # The engine keeps a run's state in the process: one check at a time, off the event loop.
        self.engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amplint-engine")
        self.opened: set[str] = set()  # as the client spells their URIs (pygls keys them unquoted)
        self.findings: dict[str, Findings] = {}
        self.scheduled: dict[str, asyncio.Task] = {}

    def document(self, uri: str):
        return self.workspace.text_documents.get(unquote(uri)) if uri in self.opened else None

    async def in_engine(self, work, *args):
        return await asyncio.get_running_loop().run_in_executor(self.engine, work, *args)

    def forget_projects(self) -> None:
        """Read the projects from disk again at the next check, and check every document again."""
        self.findings.clear()
        self.engine.submit(project_index.forget)  # in order with the checks, on the engine's thread

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(kind, message))

    def schedule(self, uri: str, delay: float) -> None:
        """Check the document after ``delay`` seconds, instead of any check still waiting."""
        waiting = self.scheduled.pop(uri, None)
        if waiting is not None:
            waiting.cancel()
        self.scheduled[uri] = asyncio.get_running_loop().create_task(self._check_later(uri, delay))

    async def _check_later(self, uri: str, delay: float) -> None:
        await asyncio.sleep(delay)
        findings = await self.current(uri)
        if findings is not None and self.scheduled.get(uri) is asyncio.current_task():
            del self.scheduled[uri]
            self.publish(uri, findings)

    async def current(self, uri: str) -> Findings | None:
        """The findings of the document's latest version (checked now if need be); None for a
        document that is not open, is a notebook, or changed while it was checked."""
        document = self.document(uri)
        if document is None or notebook.is_notebook(uri):
            return None
        known = self.findings.get(uri)
        if known is not None and known.version == document.version:
            return known
        version, source = document.version, document.source
        name = _name(uri)
        checked, _ = await self.in_engine(lint.check, name, source, False, lambda: self.replaced(uri, version))
        if checked.abandoned:
            return None
        if checked.failure:
            self.log(types.MessageType.Error, f"amplint: {name}: {checked.failure}")
        document = self.document(uri)
        if document is None or document.version != version:
            return None
        findings = Findings(version, Text(source, document.position_codec), checked.diagnostics)
        findings.published = [self.to_lsp(findings.text, d) for d in findings.diagnostics]
        self.findings[uri] = findings
        return findings

    def replaced(self, uri: str, version: int | None) -> bool:
        """Whether the document is closed, or has a version after ``version`` (asked from the
        engine's thread, between two rules of a check)."""
        document = self.document(uri)
        return document is None or document.version != version

    def publish(self, uri: str, findings: Findings) -> None:
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri, findings.published, findings.version))

    def to_lsp(self, text: Text, d: Diagnostic) -> types.Diagnostic:
        engine = d.code in (SYNTAX_ERROR[0], INTERNAL_ERROR[0])
        related = [types.DiagnosticRelatedInformation(
            types.Location(from_fs_path(os.path.abspath(r.path)),
                           types.Range(types.Position(r.row - 1, 0), types.Position(r.row - 1, 0))),
            r.message) for r in d.related]
        return types.Diagnostic(
            range=text.range(d.location, d.end_location), message=d.message,
            severity=types.DiagnosticSeverity.Error if engine else types.DiagnosticSeverity.Warning,
            code=d.code, code_description=types.CodeDescription(d.url or _ENGINE_CODES_URL),
            source="amplint", related_information=related or None)

    async def fixed_text(self, uri: str, findings: Findings) -> str:
        """The text after every safe fix, as `--fix` would write it (kept for the version)."""
        if findings.fixed_text is None:
            _, fixed = await self.in_engine(lint.check, _name(uri), findings.text.text, True)
            findings.fixed_text = fixed if fixed is not None else findings.text.text
        return findings.fixed_text


server = AmplintServer()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: AmplintServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.opened.add(params.text_document.uri)
    ls.schedule(params.text_document.uri, 0)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: AmplintServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, DEBOUNCE_SECONDS)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: AmplintServer, params: types.DidSaveTextDocumentParams) -> None:
    # What the saved file tells the others (an autocast call, a wrapper, a declared torch)
    # may have changed: every open document is checked again, the saved one first.
    saved = params.text_document.uri
    ls.forget_projects()
    for uri in [saved, *(u for u in ls.opened if u != saved)]:
        ls.schedule(uri, 0)


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched_files(ls: AmplintServer, params: types.DidChangeWatchedFilesParams) -> None:
    # A file changed on disk outside the editor (a checkout, a pyproject.toml edited elsewhere).
    ls.forget_projects()
    for uri in ls.opened:
        ls.schedule(uri, DEBOUNCE_SECONDS)


# What the project's facts and settings are read from. One pattern each: some clients (eglot
# 1.9) refuse a registration whose patterns use braces.
_WATCHED = ("**/*.py", *(f"**/*{suffix}" for suffix in CONFIG_SUFFIXES), "**/setup.cfg", "**/requirements*.txt")


@server.feature(types.INITIALIZED)
async def initialized(ls: AmplintServer, params: types.InitializedParams) -> None:
    watching = ls.client_capabilities.workspace and ls.client_capabilities.workspace.did_change_watched_files
    if not (watching and watching.dynamic_registration):
        return
    try:
        await ls.client_register_capability_async(types.RegistrationParams([types.Registration(
            "amplint-watched-files", types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            types.DidChangeWatchedFilesRegistrationOptions([types.FileSystemWatcher(p) for p in _WATCHED]))]))
    except Exception as exc:  # the client's refusal: saves in the editor still trigger checks
        ls.log(types.MessageType.Warning, f"amplint: the client does not watch files for amplint: {exc}")


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: AmplintServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.opened.discard(uri)
    waiting = ls.scheduled.pop(uri, None)
    if waiting is not None:
        waiting.cancel()
    ls.findings.pop(uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri, []))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> tuple[int, int]:
        return p.line, p.character

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
    code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]))
async def code_action(ls: AmplintServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    uri = params.text_document.uri
    findings = await ls.current(uri)
    if findings is None:
        return None
    only = params.context.only
    text = findings.text
    actions = []
    for d, shown in zip(findings.diagnostics, findings.published):
        if not _kind_wanted(types.CodeActionKind.QuickFix, only) or not _overlaps(shown.range, params.range):
            continue
        if d.fix is not None:
            unsafe = d.fix.applicability == "unsafe"
            actions.append(types.CodeAction(
                title=f"{d.fix.message} ({d.code}{', unsafe fix' if unsafe else ''})",
                kind=types.CodeActionKind.QuickFix, diagnostics=[shown], is_preferred=not unsafe,
                edit=types.WorkspaceEdit(changes={uri: [text.edit(e.start, e.end, e.content) for e in d.fix.edits]})))
        if d.code not in _NO_NOQA:
            added = noqa.add_codes(text.text, {d.location.row: {d.code}})
            if added.lines:
                actions.append(types.CodeAction(
                    title=f"Add `# noqa: {d.code}` on line {d.location.row}", kind=types.CodeActionKind.QuickFix,
                    diagnostics=[shown], edit=types.WorkspaceEdit(changes={uri: text.edits_to(added.text)})))
    if _kind_wanted(FIX_ALL, only) and any(d.fix is not None and d.fix.applicability == "safe"
                                            for d in findings.diagnostics):
        fixed = await ls.fixed_text(uri, findings)
        if fixed != text.text:
            actions.append(types.CodeAction(
                title="Fix all safe amplint findings", kind=FIX_ALL,
                edit=types.WorkspaceEdit(changes={uri: text.edits_to(fixed)})))
    return actions


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: AmplintServer, params: types.HoverParams) -> types.Hover | None:
    findings = await ls.current(params.text_document.uri)
    if findings is None:
        return None
    at = types.Range(params.position, params.position)
    codes = list(dict.fromkeys(d.code for d, shown in zip(findings.diagnostics, findings.published)
                               if _overlaps(shown.range, at)))
    docs = [doc for doc in map(rule_text, codes) if doc]
    if not docs:
        return None
    return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, "\n\n---\n\n".join(docs)))


def serve() -> None:
    """Answer the client on stdin / stdout until it says exit."""
    logging.basicConfig(level=logging.WARNING, format="amplint server: %(message)s")  # stderr: the client's log
    project_index.keep_between_runs()
    server.start_io()
