"""A minimal Language Server Protocol client: `amplint server` as a subprocess, JSON-RPC with
Content-Length framing on its stdin / stdout, as an editor speaks it. Shared by
tests/test_server.py and benchmarks/lsp_latency.py."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

# A guard against a server that never answers: a test then fails instead of hanging.
PATIENCE_SECONDS = 60


class ServerExited(Exception):
    pass


class Client:
    def __init__(self, cwd: str | Path | None = None, command: list[str] | None = None):
        self.process = subprocess.Popen(command or [sys.executable, "-m", "amplint", "server"], cwd=cwd,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.messages: queue.Queue[dict | None] = queue.Queue()
        self.notifications: list[dict] = []  # every notification received, in order
        self.server_requests: list[dict] = []  # requests from the server (each answered with null)
        self._responses: dict[int, dict] = {}
        self._next_id = 0
        self._write_lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self.stderr: list[bytes] = []
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while True:
                header = stream.readline()
                if not header:
                    self.messages.put(None)
                    return
                header = header.strip()
                if not header:
                    break
                name, _, value = header.decode("ascii").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            self.messages.put(json.loads(stream.read(length)))

    def _send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        with self._write_lock:
            self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.process.stdin.flush()

    def _take(self, deadline: float) -> dict:
        """The next message; a request from the server is answered (with null) on the way."""
        while True:
            try:
                message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no message from the server in {PATIENCE_SECONDS} s") from None
            if message is None:
                raise ServerExited(b"".join(self.stderr).decode("utf-8", "replace"))
            if "method" in message and "id" in message:
                self.server_requests.append(message)
                self._send({"id": message["id"], "result": None})
            elif "method" in message:
                self.notifications.append(message)
                return message
            else:
                self._responses[message["id"]] = message
                return message

    def request(self, method: str, params: dict | None = None) -> object:
        self._next_id += 1
        ident = self._next_id
        self._send({"id": ident, "method": method, "params": params})
        deadline = time.monotonic() + PATIENCE_SECONDS
        while ident not in self._responses:
            self._take(deadline)
        response = self._responses.pop(ident)
        if "error" in response:
            raise RuntimeError(f"{method}: {response['error']}")
        return response["result"]

    def notify(self, method: str, params: dict | None = None) -> None:
        self._send({"method": method, "params": params})

    def wait_for(self, method: str, match=lambda params: True) -> dict:
        """The params of the first notification of ``method`` that ``match`` accepts, among
        those not yet waited for."""
        deadline = time.monotonic() + PATIENCE_SECONDS
        seen = 0
        while True:
            for index in range(seen, len(self.notifications)):
                message = self.notifications[index]
                if message["method"] == method and match(message["params"]):
                    del self.notifications[index]
                    return message["params"]
            seen = len(self.notifications)
            self._take(deadline)

    def diagnostics(self, uri: str, version: int | None = None) -> list[dict]:
        """The diagnostics the server publishes next for ``uri`` (for ``version``, if given)."""
        return self.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri and (
            version is None or p.get("version") == version))["diagnostics"]

    def initialize(self, root: Path, capabilities: dict | None = None) -> dict:
        result = self.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                             "capabilities": capabilities or {}})
        self.notify("initialized", {})
        return result

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": version, "text": text}})
        return uri

    def change(self, uri: str, text: str, version: int) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [{"text": text}]})

    def close(self, uri: str) -> None:
        self.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    def shutdown_and_exit(self) -> int:
        self.request("shutdown")
        self.notify("exit")
        return self.process.wait(timeout=PATIENCE_SECONDS)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def apply_edits(text: str, edits: list[dict]) -> str:
    """``text`` with LSP TextEdits applied (positions in UTF-16 units, lines as LSP counts them:
    only \r\n, \r and \n end one)."""
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(position: dict) -> int:
        if position["line"] >= len(lines):
            return len(text)
        line = lines[position["line"]]
        units, index = 0, 0
        while index < len(line) and units < position["character"]:
            units += 2 if ord(line[index]) > 0xFFFF else 1
            index += 1
        return starts[position["line"]] + index

    for edit in sorted(edits, key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]),
                       reverse=True):
        start, end = offset(edit["range"]["start"]), offset(edit["range"]["end"])
        text = text[:start] + edit["newText"] + text[end:]
    return text


def rss_kib(pid: int) -> int:
    """The process's resident memory (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError(f"no VmRSS for process {pid}")
