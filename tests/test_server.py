"""`amplint server` driven as an editor drives it: the real subprocess, JSON-RPC over its
stdin / stdout (tests/lsp_client.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from lsp_client import Client, apply_edits, rss_kib

from amplint.engine.rule import rule_by_code
from amplint.engine.source import MAX_FILE_BYTES

# The shape of fixtures/faulty/train_amp.py's loop: the gradients are clipped while still scaled.
CLIP_BEFORE_UNSCALE = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    def train_one_epoch(model, loader, optimizer, scaler, device, max_grad_norm):
        model.train()
        for images, labels in loader:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                logits = model(images.to(device))
                loss = F.cross_entropy(logits, labels.to(device))
            scaler.scale(loss).backward()
            # Clip to keep early training stable.
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
""")
CLIP_LINE = CLIP_BEFORE_UNSCALE.splitlines().index(
    "        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)")


@pytest.fixture
def server(tmp_path):
    """A server started in a project folder (marked by its pyproject.toml), initialized."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'trainer'\n")
    client = Client(cwd=tmp_path)
    client.initialize(tmp_path)
    yield client
    client.kill()


def _code_actions(client: Client, uri: str, diagnostic: dict, only: list[str] | None = None) -> list[dict]:
    context = {"diagnostics": [diagnostic], **({"only": only} if only else {})}
    return client.request("textDocument/codeAction",
                          {"textDocument": {"uri": uri}, "range": diagnostic["range"], "context": context})


def _command_line(project: Path, path: Path, text: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amplint", "check", "--stdin-filename", str(path), *options, "-"],
                          cwd=project, input=text, capture_output=True, text=True)


def test_a_clip_before_unscale_is_found_fixed_and_cleared(server, tmp_path):
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    [found] = server.diagnostics(uri, 1)
    assert found["code"] == "AMP002" and found["source"] == "amplint" and found["severity"] == 2
    assert found["range"]["start"] == {"line": CLIP_LINE, "character": 8}
    assert found["codeDescription"]["href"] == rule_by_code("AMP002").url()

    actions = _code_actions(server, uri, found)
    [fix] = [a for a in actions if a["kind"] == "quickfix" and "noqa" not in a["title"]]
    assert "AMP002" in fix["title"] and "unsafe" not in fix["title"] and fix["isPreferred"]
    fixed = apply_edits(CLIP_BEFORE_UNSCALE, fix["edit"]["changes"][uri])
    assert fixed.splitlines()[CLIP_LINE] == "        scaler.unscale_(optimizer)"

    server.change(uri, fixed, 2)
    assert server.diagnostics(uri, 2) == []
    # The linter's side never imports torch: no module of it is mapped into the server.
    assert "/torch/" not in Path(f"/proc/{server.pid}/maps").read_text()
    assert server.shutdown_and_exit() == 0


def test_an_unsafe_fix_says_so_and_fix_all_applies_what_check_fix_does(server, tmp_path):
    deprecated_scaler = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    index_put = textwrap.dedent("""\

        def scatter_logits(model, images, index):
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                logits = model(images)
                table = torch.zeros(logits.shape, device=logits.device)
                table[index] = logits
            return table
    """)
    text = CLIP_BEFORE_UNSCALE.replace("import torch\n", deprecated_scaler) + index_put
    path = tmp_path / "train.py"
    uri = server.open(path, text)
    found = {d["code"]: d for d in server.diagnostics(uri, 1)}
    assert set(found) == {"AMP002", "AMP003", "AMP004"}
    [unsafe] = [a for a in _code_actions(server, uri, found["AMP003"], only=["quickfix"]) if "noqa" not in a["title"]]
    assert unsafe["title"].endswith("(AMP003, unsafe fix)") and not unsafe["isPreferred"]

    [fix_all] = _code_actions(server, uri, found["AMP004"], only=["source.fixAll"])
    assert fix_all["kind"] == "source.fixAll.amplint"
    fixed = apply_edits(text, fix_all["edit"]["changes"][uri])
    assert fixed == _command_line(tmp_path, path, text, "--fix").stdout
    server.change(uri, fixed, 2)
    assert [d["code"] for d in server.diagnostics(uri, 2)] == ["AMP003"]  # its fix is unsafe


def test_hover_shows_the_rule_documentation(server, tmp_path, run_amplint):
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    [found] = server.diagnostics(uri, 1)
    inside = {"line": CLIP_LINE, "character": found["range"]["start"]["character"] + 5}
    shown = server.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": inside})
    assert shown["contents"]["kind"] == "markdown"
    assert shown["contents"]["value"] == run_amplint("rule", "AMP002").stdout.strip()
    assert server.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                 "position": {"line": 0, "character": 0}}) is None


def test_add_noqa_action_suppresses_the_finding(server, tmp_path):
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    [found] = server.diagnostics(uri, 1)
    [add_noqa] = [a for a in _code_actions(server, uri, found) if "noqa" in a["title"]]
    assert add_noqa["title"] == f"Add `# noqa: AMP002` on line {CLIP_LINE + 1}"
    suppressed = apply_edits(CLIP_BEFORE_UNSCALE, add_noqa["edit"]["changes"][uri])
    assert suppressed.splitlines()[CLIP_LINE] == \
        "        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)  # noqa: AMP002"
    server.change(uri, suppressed, 2)
    assert server.diagnostics(uri, 2) == []


def test_only_the_latest_version_of_a_burst_of_changes_is_published(server, tmp_path):
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    server.diagnostics(uri, 1)
    server.change(uri, "def broken(:\n", 2)
    server.change(uri, CLIP_BEFORE_UNSCALE + "x = (\n", 3)
    server.change(uri, CLIP_BEFORE_UNSCALE.replace("max_grad_norm)\n", "max_grad_norm)  # noqa\n"), 4)
    assert server.diagnostics(uri, 4) == []
    published = [n["params"]["version"] for n in server.notifications if n["method"] == "textDocument/publishDiagnostics"]
    assert published == []  # versions 2 and 3 were never checked on their own


@pytest.fixture
def crossfile_project(tmp_path):
    project = tmp_path / "crossfile"
    shutil.copytree(ROOT / "fixtures" / "crossfile", project)
    with (project / "pyproject.toml").open("a") as toml:
        # Preview on: the loss's AMP008 under another file's autocast is a preview path.
        toml.write('\n[tool.amplint]\npreview = true\nper-file-ignores = {"trainer_app/losses.py" = ["AMP018"]}\n')
    return project


def test_settings_and_other_files_of_the_project_as_check_reads_them(crossfile_project):
    project = crossfile_project
    losses, lit_module = project / "trainer_app" / "losses.py", project / "trainer_app" / "lit_module.py"
    client = Client(cwd=project)
    try:
        client.initialize(project)
        uri = client.open(losses, losses.read_text())
        found = client.diagnostics(uri, 1)
        expected = json.loads(_command_line(project, losses, losses.read_text(), "--output-format", "json").stdout)
        assert [(d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1) for d in found] == \
            [(e["code"], e["location"]["row"], e["location"]["column"]) for e in expected]
        assert "AMP018" not in {d["code"] for d in found}  # per-file-ignores of [tool.amplint]
        bce = next(d for d in found if d["code"] == "AMP008")
        [related] = bce["relatedInformation"]
        assert related["location"]["uri"] == lit_module.as_uri()
        assert related["location"]["range"]["start"]["line"] == 23 and "16-mixed" in related["message"]

        # Lightning's mixed precision turned off and saved: the loss module is checked again,
        # and now the trainer's own autocast wrapper is what runs it under autocast.
        module_uri = client.open(lit_module, lit_module.read_text())
        client.diagnostics(module_uri, 1)
        edited = lit_module.read_text().replace('precision="16-mixed"', 'precision="32-true"')
        client.change(module_uri, edited, 2)
        lit_module.write_text(edited)
        client.notify("textDocument/didSave", {"textDocument": {"uri": module_uri}})
        again = client.diagnostics(uri, 1)
        bce = next(d for d in again if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == (project / "trainer_app" / "utils.py").as_uri()
        assert client.shutdown_and_exit() == 0
    finally:
        client.kill()


def test_files_changed_on_disk_are_watched_and_recheck_the_open_documents(crossfile_project):
    project = crossfile_project
    losses, lit_module = project / "trainer_app" / "losses.py", project / "trainer_app" / "lit_module.py"
    client = Client(cwd=project)
    try:
        client.initialize(project, {"workspace": {"didChangeWatchedFiles": {"dynamicRegistration": True}}})
        uri = client.open(losses, losses.read_text())
        bce = next(d for d in client.diagnostics(uri, 1) if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == lit_module.as_uri()
        [registration] = client.server_requests[0]["params"]["registrations"]
        assert registration["method"] == "workspace/didChangeWatchedFiles"
        assert {"globPattern": "**/*.py"} in registration["registerOptions"]["watchers"]

        # Changed outside the editor (a checkout): the client reports it, the loss module is checked again.
        lit_module.write_text(lit_module.read_text().replace('precision="16-mixed"', 'precision="32-true"'))
        client.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": lit_module.as_uri(), "type": 2}]})
        bce = next(d for d in client.diagnostics(uri, 1) if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == (project / "trainer_app" / "utils.py").as_uri()
    finally:
        client.kill()


def test_an_edit_reads_the_other_files_as_they_are_on_disk_then(crossfile_project):
    # What the project's other modules say is kept between edits by their content: a module
    # saved by another editor (no notification reaches the server) is read anew at the next edit.
    project = crossfile_project
    losses, lit_module = project / "trainer_app" / "losses.py", project / "trainer_app" / "lit_module.py"
    client = Client(cwd=project)
    try:
        client.initialize(project)
        text = losses.read_text()
        uri = client.open(losses, text)
        bce = next(d for d in client.diagnostics(uri, 1) if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == lit_module.as_uri()
        client.change(uri, text + "\nLABEL_SMOOTHING = 0.1\n", 2)
        bce = next(d for d in client.diagnostics(uri, 2) if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == lit_module.as_uri()

        lit_module.write_text(lit_module.read_text().replace('precision="16-mixed"', 'precision="32-true"'))
        client.change(uri, text + "\nLABEL_SMOOTHING = 0.2\n", 3)
        bce = next(d for d in client.diagnostics(uri, 3) if d["code"] == "AMP008")
        assert bce["relatedInformation"][0]["location"]["uri"] == (project / "trainer_app" / "utils.py").as_uri()
    finally:
        client.kill()


def test_a_change_back_to_the_text_checked_last_gives_its_findings_for_the_new_version(server, tmp_path):
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    [found] = server.diagnostics(uri, 1)
    unscaled = CLIP_BEFORE_UNSCALE.replace("        # Clip", "        scaler.unscale_(optimizer)\n        # Clip")
    server.change(uri, unscaled, 2)
    assert server.diagnostics(uri, 2) == []
    server.change(uri, unscaled + "\n# an edit undone\n", 3)
    assert server.diagnostics(uri, 3) == []
    server.change(uri, unscaled, 4)  # undone
    assert server.diagnostics(uri, 4) == []
    server.change(uri, CLIP_BEFORE_UNSCALE, 5)
    assert server.diagnostics(uri, 5) == [found]


def _log_messages(client: Client) -> list[dict]:
    return [n["params"] for n in client.notifications if n["method"] == "window/logMessage"]


def test_failures_are_logged_and_published_as_amp999_and_the_server_goes_on(server, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "pyproject.toml").write_text('[tool.amplint]\nselect = ["AMP9X"]\n')
    cases = {
        tmp_path / "broken" / "train.py": (CLIP_BEFORE_UNSCALE, "amplint configuration error: "),
        tmp_path / "binary.py": ("x = 1\x00\n", "binary file (contains NUL bytes)"),
        tmp_path / "surrogate.py": ("x = '\ud800'\n", "cannot be encoded as utf-8"),
        tmp_path / "huge.py": ("#" * (MAX_FILE_BYTES + 1), "larger than 64 MiB; not checked"),
    }
    for path, (text, message) in cases.items():
        uri = server.open(path, text)
        [failed] = server.diagnostics(uri, 1)
        assert failed["code"] == "AMP999" and failed["severity"] == 1 and message in failed["message"], failed
        server.close(uri)
    logged = _log_messages(server)
    assert "unknown rule code 'AMP9X'" in logged[0]["message"] and logged[0]["type"] == 1
    assert "binary file" in logged[1]["message"]
    uri = server.open(tmp_path / "train.py", CLIP_BEFORE_UNSCALE)
    assert [d["code"] for d in server.diagnostics(uri, 1)] == ["AMP002"]
    assert server.shutdown_and_exit() == 0


# Measured: 58 MiB once initialized, 67 MiB after the first ten documents and still 67 MiB
# after a hundred; the bound is twice that. It catches a leak of about 0.7 MiB or more per
# document (a parse tree of one of these is 0.12 MiB: ten such trees kept per check would cross it).
RSS_BOUND_KIB = 140 * 1024


def test_memory_stays_bounded_over_a_hundred_documents(server, tmp_path):
    base = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()
    for batch in range(10):
        uris = {}
        for index in range(batch * 10, batch * 10 + 10):
            text = base.replace("max_grad_norm", f"max_grad_norm_{index}")
            uri = server.open(tmp_path / f"train_{index}.py", text)
            # Changed at once: the open's check is dropped, the change's is published.
            server.change(uri, text + f"\nSTEPS_{index} = {index}\n", 2)
            uris[uri] = text
        for uri in uris:
            assert {d["code"] for d in server.diagnostics(uri, 2)} == {"AMP001", "AMP002", "AMP004"}
            server.close(uri)
    assert rss_kib(server.pid) < RSS_BOUND_KIB
    assert server.shutdown_and_exit() == 0


def test_a_check_of_a_replaced_text_is_given_up_between_two_rules(tmp_path):
    """The server checks one document at a time: a check of a version the editor has already
    replaced stops before its next rule, and no finding of it is handed back."""
    from amplint.server import lint

    path = tmp_path / "train.py"
    path.write_text(CLIP_BEFORE_UNSCALE)
    checked, _ = lint.check(str(path), CLIP_BEFORE_UNSCALE)
    assert [d.code for d in checked.diagnostics] == ["AMP002"] and not checked.abandoned
    asked = []

    def replaced_after_two_rules() -> bool:
        asked.append(True)
        return len(asked) > 2

    checked, _ = lint.check(str(path), CLIP_BEFORE_UNSCALE, superseded=replaced_after_two_rules)
    assert checked.abandoned and checked.diagnostics == [] and checked.failure is None
    assert len(asked) == 3  # asked before each rule: the third gave up
    # A fix-all asked for a text keeps going whatever the editor does meanwhile.
    checked, fixed = lint.check(str(path), CLIP_BEFORE_UNSCALE, fix=True)
    assert not checked.abandoned and "scaler.unscale_(optimizer)" in fixed



GATE = 'TORCH_GE_2_4 = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 4)\n'

BASE_TRAINER = """\
import torch

{gate}

class BaseTrainer:
    def clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
"""

AMP_TRAINER = textwrap.dedent("""\
    import torch
    from trainer.base import TORCH_GE_2_4, BaseTrainer

    if TORCH_GE_2_4:
        GradScaler = torch.amp.GradScaler
    else:
        GradScaler = torch.cuda.amp.GradScaler


    class AmpTrainer(BaseTrainer):
        def fit(self, loader):
            scaler = GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = self.model(x).float().mean()
                scaler.scale(loss).backward()
                scaler.unscale_(self.optimizer)
                self.clip()
                scaler.step(self.optimizer)
                scaler.update()
""")


def test_memory_stays_bounded_while_a_module_the_document_imports_is_saved_again_and_again(tmp_path):
    """Each save of a module the open document reads (its base class, a torch-version flag)
    is read anew; what was built from its older texts is not kept beside it."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'trainer'\ndependencies = ['torch>=2.4']\n")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    base = tmp_path / "trainer" / "base.py"
    # A large module: its trees are what a leak would keep, one set per version saved.
    padding = "".join(f"\n\ndef helper_{i}(x, scale={i}):\n    y = x * scale\n    return y + {i}\n"
                      for i in range(400))
    base.write_text(BASE_TRAINER.format(gate=GATE) + padding)
    train = tmp_path / "trainer" / "train.py"
    train.write_text(AMP_TRAINER)
    client = Client(cwd=tmp_path)
    try:
        client.initialize(tmp_path)
        uri = client.open(train, AMP_TRAINER)
        assert client.diagnostics(uri, 1) == []  # the fallback sits behind the version gate
        first = rss_kib(client.process.pid)
        for saved in range(1, 21):
            # Every other save pins the flag to a constant: no gate, and the fallback is reported.
            gate = GATE if saved % 2 == 0 else "TORCH_GE_2_4 = False\n"
            base.write_text(BASE_TRAINER.format(gate=gate) + padding + "# saved\n" * saved)
            client.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": base.as_uri(), "type": 2}]})
            found = client.diagnostics(uri, 1)
            assert [(d["code"], d["range"]["start"]["line"] + 1) for d in found] == (
                [] if saved % 2 == 0 else [("AMP004", 7)])
        grown = rss_kib(client.process.pid) - first
        # Measured: a few MiB; with every version's trees kept, over 100 MiB.
        assert grown < 40 * 1024, f"{grown} KiB more after 20 saves"
        assert client.shutdown_and_exit() == 0
    finally:
        client.kill()
