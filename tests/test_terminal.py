"""What a person at a terminal sees: the full format's source context, colours, the summary
line and the progress bar."""

import io
import os
import pty
import subprocess
import sys

from amplint.engine.diagnostics import Diagnostic, Location
from amplint.output.text import full
from amplint.terminal import progress_bar, use_color

TRAIN = """import torch

def train(model, loader, optimizer, scaler):
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""


def test_full_format_shows_the_line_with_a_caret_under_the_finding(run_amplint, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    result = run_amplint("check", "train.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == (
        "train.py:7:13: AMP001 `backward()` inside an autocast region: run the backward pass "
        "after the `with` block\n"
        "  |\n"
        "6 |             loss = model(x, y)\n"
        "7 |             scaler.scale(loss).backward()\n"
        "  |             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^ AMP001\n"
        "8 |         scaler.step(optimizer)\n"
        "  |\n"
        "  = help: Move the backward pass out of the autocast region [*]\n")
    assert result.stderr.strip() == "Found 1 finding in 1 file (1 fixable with --fix)."


def _diagnostic(row, col, end_row, end_col):
    return Diagnostic("AMP999", "x", "msg", "f.py", Location(row, col), Location(end_row, end_col))


def test_full_format_expands_tabs_and_underlines_the_first_line_of_a_long_finding():
    source = "def f():\n\treturn g(\n\t\t1)\n"
    text = full([_diagnostic(2, 9, 3, 5)], sources={"f.py": source})
    assert "2 |     return g(\n  |            ^^ AMP999\n" in text
    one_line = full([_diagnostic(2, 9, 2, 10)], sources={"f.py": source})
    assert "  |            ^ AMP999\n" in one_line


def test_colour_choice_follows_the_flag_the_terminal_and_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color("auto", Tty()) and not use_color("auto", io.StringIO())
    assert use_color("always", io.StringIO()) and not use_color("never", Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color("auto", Tty()) and use_color("always", Tty())


def test_color_always_colours_and_pipes_stay_plain(run_amplint, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    coloured = run_amplint("check", "--color", "always", "train.py", cwd=tmp_path)
    assert "\x1b[1;31mAMP001\x1b[0m" in coloured.stdout
    plain = run_amplint("check", "train.py", cwd=tmp_path)  # stdout is a pipe: auto means no
    assert "\x1b[" not in plain.stdout + plain.stderr


def test_progress_bar_draws_on_a_terminal_and_erases_itself():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    with progress_bar("checking", unit="files", stream=stream) as update:
        for done in range(1, 401):
            update(done, 400)
    drawn = stream.getvalue()
    assert "checking [" in drawn and "400/400 files" in drawn
    assert drawn.endswith("\r")  # the last frame is blanked out
    with progress_bar("checking", unit="files", stream=io.StringIO()) as update:
        assert update is None  # not a terminal: no bar at all


def test_a_long_check_on_a_terminal_shows_the_bar_on_stderr(tmp_path):
    for i in range(210):
        (tmp_path / f"m{i:03d}.py").write_text("import torch\nx = torch.ones(3)\n")
    # stderr is a pseudo-terminal, stdout a pipe: the bar goes to stderr only.
    controller, terminal = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "."], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=terminal, env={**os.environ, "NO_COLOR": "1"})
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"210/210 files" in seen and b"All checks passed (210 files)." in seen
