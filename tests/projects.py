"""Multi-file projects written for a test, and what `amplint check` finds in them through the
real CLI (JSON output): each finding as (file, row, message, related locations)."""

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from amplint.cli import main


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    """Each file of ``files`` (path from ``root``: text, dedented; bytes as they are), its
    folders made."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (root / name).write_bytes(text)
        else:
            (root / name).write_text(textwrap.dedent(text))
    return root


def findings(root: Path, code: str, monkeypatch, *options: str) -> list[tuple]:
    """The findings of rule ``code`` in the project at ``root``, checked from its folder."""
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", code, *options, "--output-format", "json",
                                       "--no-cache", "."])
    assert result.exit_code in (0, 1), result.output
    return [(f["filename"], f["location"]["row"], f["message"],
             [(r["filename"], r["location"]["row"], r["message"]) for r in f.get("related", [])])
            for f in json.loads(result.output)]
