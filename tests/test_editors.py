"""The editor configurations of docs/editors.md, run in the real editors, headless, where they
are installed (`nvim` 0.11+, `emacs` with eglot): the documented snippet as the editor's whole
configuration, a training loop that clips before `scaler.unscale_`, and its AMP002 finding."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from test_server import CLIP_BEFORE_UNSCALE, CLIP_LINE

DOC = (ROOT / "docs" / "editors.md").read_text(encoding="utf-8")
# The editors start `amplint` by name: the one installed beside this Python.
PATH = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"


def _snippets(section: str, language: str) -> list[str]:
    body = DOC.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, re.DOTALL)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'trainer'\n")
    (tmp_path / "train.py").write_text(CLIP_BEFORE_UNSCALE)
    return tmp_path


def _nvim() -> str:
    nvim = shutil.which("nvim")
    if nvim is None:
        pytest.skip("nvim is not installed")
    version = subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout
    major, minor = map(int, re.match(r"NVIM v(\d+)\.(\d+)", version).groups())
    if (major, minor) < (0, 11):
        pytest.skip(f"nvim {major}.{minor} is older than the documented configurations' 0.11")
    return nvim


# Waits (up to 30 s: a guard, not a measure) for amplint's findings, prints them as JSON, then
# applies the quick fix of the first one and prints what is left once the server has answered.
NVIM_SESSION = textwrap.dedent("""\
    local function settle(done) vim.wait(30000, done, 50) end
    settle(function() return #vim.diagnostic.get(0) > 0 end)
    local found = vim.diagnostic.get(0)
    io.stdout:write(vim.json.encode(found) .. "\\n")
    vim.api.nvim_win_set_cursor(0, { found[1].lnum + 1, found[1].col })
    vim.lsp.buf.code_action({
      apply = true,
      filter = function(action) return action.kind == "quickfix" and not action.title:find("noqa") end,
    })
    settle(function() return #vim.diagnostic.get(0) == 0 end)
    io.stdout:write(vim.json.encode(vim.diagnostic.get(0)) .. "\\n")
    vim.cmd("wqa")
""")


@pytest.mark.parametrize("which", [0, 1], ids=["vim.lsp.config", "vim.lsp.start"])
def test_neovim_configurations(project, which):
    nvim = _nvim()
    (project / "init.lua").write_text(_snippets("Neovim", "lua")[which])
    (project / "session.lua").write_text(NVIM_SESSION)
    done = subprocess.run([nvim, "--headless", "-u", "init.lua", "-c", "luafile session.lua", "train.py"],
                          cwd=project, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": PATH})
    before, after = [json.loads(line) for line in done.stdout.splitlines()[-2:]]
    assert [(d["code"], d["lnum"], d["source"]) for d in before] == [("AMP002", CLIP_LINE, "amplint")]
    assert after == []
    assert "scaler.unscale_(optimizer)" in (project / "train.py").read_text()


# eglot-ensure connects from the command loop, which batch mode does not run: the session runs
# its hook once, as the first command would.
EMACS_SESSION = textwrap.dedent("""\
    (require 'eglot)
    (find-file "train.py")
    (run-hooks 'post-command-hook)
    (let ((deadline (+ (float-time) 30)))
      (while (and (< (float-time) deadline) (null (flymake-diagnostics)))
        (accept-process-output nil 0.1)))
    (dolist (d (flymake-diagnostics))
      (princ (format "%d %s\\n" (line-number-at-pos (flymake-diagnostic-beg d)) (flymake-diagnostic-text d))))
    (kill-emacs 0)
""")


def test_emacs_eglot_configuration(project):
    emacs = shutil.which("emacs")
    if emacs is None:
        pytest.skip("emacs is not installed")
    if subprocess.run([emacs, "--batch", "--eval", "(require 'eglot)"], capture_output=True).returncode:
        pytest.skip("emacs has no eglot")
    [config] = _snippets("Emacs (eglot)", "elisp")
    (project / "config.el").write_text(config)
    (project / "session.el").write_text(EMACS_SESSION)
    done = subprocess.run([emacs, "--batch", "-l", "config.el", "-l", "session.el"], cwd=project,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": PATH})
    [finding] = done.stdout.splitlines()
    assert finding.startswith(f"{CLIP_LINE + 1} amplint [AMP002]: gradients are clipped"), done.stderr
