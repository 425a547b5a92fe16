"""AMP004 (deprecated torch.cuda.amp / torch.cpu.amp API) reads Python's ast: names resolve
through imports with Python's scoping, a project module's star import counts, a keyword named
like an import is no use of it, and the fix is a text edit that keeps the call's own layout.
Through the real CLI on projects written to disk."""

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from amplint.cli import main


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def _findings(root: Path) -> list[tuple[str, int, str, bool]]:
    result = CliRunner().invoke(main, ["check", "--select", "AMP004", "--output-format", "json", "--no-cache",
                                       str(root)])
    return sorted((Path(d["filename"]).name, d["location"]["row"], d["message"], d["fix"] is not None)
                  for d in json.loads(result.stdout))


def _fixed(root: Path, name: str) -> str:
    CliRunner().invoke(main, ["check", "--select", "AMP004", "--fix", "--no-cache", str(root)])
    return (root / name).read_text()


def test_a_parameter_named_like_the_module_hides_it_and_a_local_import_is_seen_where_it_is(tmp_path):
    root = _project(tmp_path, {"train.py": """
        import torch
        from torch.cuda import amp


        class Trainer:
            def step(self, amp, batch):
                with amp.autocast():
                    return self.model(batch)

            def evaluate(self, batch):
                with amp.autocast():
                    return self.model(batch)


        def resume(model, path):
            from torch.cuda.amp import GradScaler
            scaler = GradScaler(enabled=True)
            scaler.load_state_dict(torch.load(path)["scaler"])
            return model, scaler
        """})
    found = _findings(root)
    assert [(name, row) for name, row, _, _ in found] == [("train.py", 11), ("train.py", 16)]
    assert "`amp.autocast` is deprecated (torch.cuda.amp.autocast)" in found[0][2]
    assert not found[0][3]  # `amp` also names the parameter: the import is not rewritten
    assert "imports the deprecated torch.cuda.amp.GradScaler (used at line 17)" in found[1][2]
    fixed = _fixed(root, "train.py")
    assert "    from torch.amp import GradScaler\n    scaler = GradScaler(\"cuda\", enabled=True)\n" in fixed
    assert "def step(self, amp, batch):\n        with amp.autocast():" in fixed


def test_a_star_import_of_a_project_module_brings_the_deprecated_name(tmp_path):
    root = _project(tmp_path, {
        "compat.py": """
            from torch.cuda.amp import autocast, GradScaler
            """,
        "loop.py": """
            from compat import *


            def forward(model, x):
                with autocast():
                    return model(x)


            def make_scaler():
                return GradScaler()  # was torch.cuda.amp.GradScaler, now imported
            """,
        "evaluate.py": """
            from compat import *


            def evaluate(model, x):
                return model(x)  # no torch.cuda.amp.autocast() here
            """,
    })
    found = _findings(root)
    assert [(name, row) for name, row, _, _ in found] == [("loop.py", 5), ("loop.py", 10)]
    assert "`autocast` is deprecated (torch.cuda.amp.autocast)" in found[0][2]
    assert "`GradScaler` is deprecated (torch.cuda.amp.GradScaler)" in found[1][2]
    assert not found[0][3]  # the import to rewrite is in another file


def test_a_keyword_named_like_an_import_is_no_use_of_it(tmp_path):
    root = _project(tmp_path, {"run.py": """
        from torch.cuda.amp import autocast


        def run(model, x, use_amp):
            with autocast(enabled=use_amp):
                return model(x, autocast=use_amp)
        """})
    found = _findings(root)
    assert [(name, row) for name, row, _, _ in found] == [("run.py", 1)]
    assert "(used at line 5)" in found[0][2] and found[0][3]
    assert _fixed(root, "run.py").splitlines()[:5] == [
        "from torch.amp import autocast", "", "", "def run(model, x, use_amp):",
        '    with autocast("cuda", enabled=use_amp):']


def test_the_fix_keeps_the_indentation_of_a_call_over_several_lines(tmp_path):
    root = _project(tmp_path, {"loop.py": """
        import torch


        def train(model, loader, cfg):
            for batch in loader:
                with torch.cuda.amp.autocast(
                    cfg.fp16,
                    dtype=torch.float16,
                ):
                    loss = model(batch)
            scaler = torch.cuda.amp.GradScaler(
                init_scale=2.0**16, enabled=cfg.fp16  # scaled in float16 only
            )
            return loss, scaler
        """})
    assert [row for _, row, _, fix in _findings(root) if fix] == [6, 11]
    assert _fixed(root, "loop.py").splitlines()[5:12] == [
        "        with torch.amp.autocast(",
        '            "cuda", enabled=cfg.fp16, dtype=torch.float16):',
        "            loss = model(batch)",
        "    scaler = torch.amp.GradScaler(",
        '        "cuda", init_scale=2.0**16, enabled=cfg.fp16  # scaled in float16 only',
        "    )",
        "    return loss, scaler",
    ]
