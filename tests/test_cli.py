"""The check CLI as users run it: exit codes, formats, noqa, configuration, discovery, bad input."""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from amplint.cli import main

FAULTY = textwrap.dedent("""\
    import torch

    def step(model, x, scaler, opt):
        with torch.autocast("cuda"):
            loss = model(x).mean()
            scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
""")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(FAULTY)
    (tmp_path / "pkg" / "clean.py").write_text("import torch\nx = torch.ones(3)\n")
    return tmp_path


def test_concise_output_is_sorted_with_1_based_columns(run_amplint, project):
    result = run_amplint("check", "--output-format", "concise", "pkg", cwd=project)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(os.path.join("pkg", "train.py") + ":6:9: AMP001 ")
    assert lines[1].startswith(os.path.join("pkg", "train.py") + ":7:5: AMP002 ")
    assert "Found 2 findings in 1 file (2 fixable with --fix)." in result.stderr


def test_clean_run_exits_zero(run_amplint, project):
    result = run_amplint("check", "pkg/clean.py", cwd=project)
    assert result.returncode == 0 and result.stdout == ""


def test_exit_zero_and_statistics(run_amplint, project):
    result = run_amplint("check", "--statistics", "--exit-zero", "pkg", cwd=project)
    assert result.returncode == 0
    assert "AMP001\t[*] backward-inside-autocast" in result.stdout


def test_json_has_ruffs_fields(run_amplint, project):
    result = run_amplint("check", "--output-format", "json", "pkg", cwd=project)
    data = json.loads(result.stdout)
    assert [d["code"] for d in data] == ["AMP001", "AMP002"]
    first = data[0]
    assert set(first) >= {"code", "message", "filename", "location", "end_location", "fix", "noqa_row", "url"}
    assert first["location"] == {"row": 6, "column": 9}
    assert first["fix"]["applicability"] == "safe"
    assert first["fix"]["edits"] and {"content", "location", "end_location"} <= set(first["fix"]["edits"][0])


def test_sarif_is_2_1_0(run_amplint, project):
    result = run_amplint("check", "--output-format", "sarif", "pkg", cwd=project)
    log = json.loads(result.stdout)
    assert log["version"] == "2.1.0" and "sarif" in log["$schema"]
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "amplint"
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} >= {"AMP001", "AMP002", "AMP003", "AMP004"}
    result0 = run["results"][0]
    assert result0["ruleId"] == "AMP001"
    region = result0["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] == 6 and region["startColumn"] == 9


def test_github_annotations(run_amplint, project):
    result = run_amplint("check", "--output-format", "github", "pkg", cwd=project)
    first = result.stdout.splitlines()[0]
    assert first.startswith("::error title=amplint (AMP001),file=pkg/train.py,line=6,col=9,")
    assert "::AMP001 " in first


def test_select_and_ignore(run_amplint, project):
    only = run_amplint("check", "--select", "AMP002", "pkg", cwd=project)
    assert " AMP002 " in only.stdout and " AMP001 " not in only.stdout
    ignored = run_amplint("check", "--ignore", "AMP001,AMP002", "pkg", cwd=project)
    assert ignored.returncode == 0


def test_unknown_code_on_the_command_line(run_amplint, project):
    result = run_amplint("check", "--select", "AMP777", "pkg", cwd=project)
    assert result.returncode == 2 and "unknown rule code 'AMP777'" in result.stderr


def test_ignoring_an_engine_code_says_why_it_cannot_be(run_amplint, project):
    result = run_amplint("check", "--ignore", "AMP000", "pkg", cwd=project)
    assert result.returncode == 2
    assert "AMP000 (syntax-error) is the engine's, not a rule's" in result.stderr
    assert "extend-exclude" in result.stderr


def test_noqa_line_and_file(run_amplint, project):
    path = project / "pkg" / "train.py"
    path.write_text(FAULTY.replace("scaler.scale(loss).backward()", "scaler.scale(loss).backward()  # noqa: AMP001")
                    .replace("1.0)", "1.0)  # noqa"))
    assert run_amplint("check", "pkg", cwd=project).returncode == 0
    path.write_text(FAULTY.replace("backward()", "backward()  # noqa: AMP003"))
    assert " AMP001 " in run_amplint("check", "pkg", cwd=project).stdout
    path.write_text("# amplint: noqa\n" + FAULTY)
    assert run_amplint("check", "pkg", cwd=project).returncode == 0


def test_pyproject_configuration(run_amplint, project):
    (project / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.amplint]
        ignore = ["AMP001"]
        per-file-ignores = {"pkg/legacy_*.py" = ["AMP002"]}
        extend-exclude = ["generated"]
    """))
    (project / "pkg" / "legacy_loop.py").write_text(FAULTY)
    (project / "generated").mkdir()
    (project / "generated" / "out.py").write_text(FAULTY)
    result = run_amplint("check", ".", cwd=project)
    assert " AMP001 " not in result.stdout
    assert "legacy_loop.py" not in result.stdout and "generated" not in result.stdout
    assert "train.py:7:5: AMP002" in result.stdout
    # A file named explicitly is checked even inside an excluded folder.
    assert "out.py" in run_amplint("check", "generated/out.py", cwd=project).stdout


def test_config_errors_name_file_and_key(run_amplint, project):
    (project / "pyproject.toml").write_text("[tool.amplint]\nselct = ['AMP001']\n")
    result = run_amplint("check", "pkg", cwd=project)
    assert result.returncode == 2
    assert "pyproject.toml" in result.stderr and "unknown key 'selct'" in result.stderr
    (project / "pyproject.toml").write_text("[tool.amplint]\nselect = ['AMP404']\n")
    result = run_amplint("check", "pkg", cwd=project)
    assert result.returncode == 2 and "unknown rule code 'AMP404'" in result.stderr
    (project / "pyproject.toml").write_text("[tool.amplint\nselect = \n")
    result = run_amplint("check", "pkg", cwd=project)
    assert result.returncode == 2 and "cannot read TOML" in result.stderr


def test_default_excludes(run_amplint, project):
    for folder in (".venv", "build", "site-packages", "node_modules", "__pycache__", ".ipynb_checkpoints"):
        (project / folder).mkdir()
        (project / folder / "x.py").write_text(FAULTY)
    result = run_amplint("check", "--output-format", "concise", ".", cwd=project)
    assert {line.split(":")[0] for line in result.stdout.splitlines()} == {os.path.join("pkg", "train.py")}


def test_missing_path_is_a_usage_error(run_amplint, project):
    result = run_amplint("check", "nope.py", cwd=project)
    assert result.returncode == 2 and "nope.py: no such file or directory" in result.stderr


def test_syntax_error_is_reported_and_the_run_goes_on(run_amplint, project):
    (project / "pkg" / "broken.py").write_text("import torch\nwith torch.autocast('cuda') x:\n    loss.backward()\n")
    result = run_amplint("check", "pkg", cwd=project)
    assert result.returncode == 1
    assert "broken.py:2:" in result.stdout and "AMP000" in result.stdout
    assert " AMP001 " in result.stdout


def test_fix_keeps_encoding_line_endings_and_permissions(run_amplint, tmp_path):
    path = tmp_path / "legacy.py"
    text = "# -*- coding: latin-1 -*-\n# Entraîné\nimport torch\nscaler = torch.cuda.amp.GradScaler()\n"
    path.write_bytes(text.replace("\n", "\r\n").encode("latin-1"))
    path.chmod(0o750)
    result = run_amplint("check", "--fix", path)
    assert result.returncode == 0, result.stdout + result.stderr
    data = path.read_bytes()
    assert data.decode("latin-1") == text.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")').replace("\n", "\r\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_fix_keeps_a_bom(run_amplint, tmp_path):
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbfimport torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    assert run_amplint("check", "--fix", path).returncode == 0
    assert path.read_bytes() == b'\xef\xbb\xbfimport torch\nwith torch.amp.autocast("cuda"):\n    pass\n'


def test_files_without_amp_code_are_not_parsed(run_amplint, project):
    # The prefilter skips files no rule can fire on; their syntax is not amplint's business.
    (project / "pkg" / "unrelated.py").write_text("def f(:\n")
    assert run_amplint("check", "pkg/unrelated.py", cwd=project).returncode == 0


def test_unreadable_and_binary_files_are_reported(run_amplint, tmp_path):
    (tmp_path / "blob.py").write_bytes(b"\x00\x01torch.cuda.amp\x00")
    (tmp_path / "ok.py").write_text(FAULTY)
    result = run_amplint("check", tmp_path)
    assert result.returncode == 2
    assert "blob.py" in result.stdout and "binary file" in result.stdout
    assert " AMP001 " in result.stdout


def test_rule_and_rules_commands():
    runner = CliRunner()
    doc = runner.invoke(main, ["rule", "AMP002"])
    assert doc.exit_code == 0 and "clip-grad-without-unscale" in doc.output and "## Fix safety" in doc.output
    listing = runner.invoke(main, ["rules"])
    assert listing.exit_code == 0
    assert [line.split()[0] for line in listing.output.splitlines()][:4] == ["AMP001", "AMP002", "AMP003", "AMP004"]
    assert runner.invoke(main, ["rule", "AMP404"]).exit_code == 2


def test_check_never_imports_torch(project):
    code = ("import sys\nfrom amplint.cli import main\n"
            "try:\n    main(['check', 'pkg'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_jobs_give_the_same_output_in_the_same_order(run_amplint, tmp_path):
    for i in range(70):  # enough files for the process pool to be used
        (tmp_path / f"step{i:02d}.py").write_text(FAULTY)
    one = run_amplint("check", "--output-format", "concise", "--jobs", "1", ".", cwd=tmp_path)
    two = run_amplint("check", "--output-format", "concise", "--jobs", "2", ".", cwd=tmp_path)
    assert one.returncode == two.returncode == 1
    assert one.stdout == two.stdout and one.stdout.count("\n") == 140


def test_read_only_file_is_reported_and_the_others_fixed(run_amplint, tmp_path):
    legacy = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    (tmp_path / "a.py").write_text(legacy)
    (tmp_path / "b.py").write_text(legacy)
    (tmp_path / "b.py").chmod(0o444)
    result = run_amplint("check", "--fix", tmp_path)
    assert result.returncode == 2
    assert "cannot write fixes to" in result.stdout and "b.py is read-only" in result.stdout
    assert 'GradScaler("cuda")' in (tmp_path / "a.py").read_text()
    assert (tmp_path / "b.py").read_text() == legacy


def test_empty_file_dangling_symlink_and_symlink_loop(run_amplint, tmp_path):
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "train.py").write_text(FAULTY)
    result = run_amplint("check", tmp_path)
    assert result.returncode == 2  # the dangling link could not be read
    assert "gone.py" in result.stdout and "cannot read" in result.stdout
    assert "train.py:6:9: AMP001" in result.stdout
    assert result.stdout.count("train.py:6:9: AMP001") == 1  # the loop is not followed


def test_files_git_ignores_are_skipped_unless_named(run_amplint, tmp_path):
    legacy = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    for name in ("generated/a.py", "src/b.py", "src/c_pb2.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(legacy)
    outside = run_amplint("check", "--output-format", "concise", ".", cwd=tmp_path)
    assert len(outside.stdout.splitlines()) == 3  # no git repository: every file
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("generated/\n*_pb2.py\n")
    inside = run_amplint("check", "--output-format", "concise", ".", cwd=tmp_path)
    assert [line.split(":")[0] for line in inside.stdout.splitlines()] == [os.path.join("src", "b.py")]
    named = run_amplint("check", "--output-format", "concise", "src/c_pb2.py", cwd=tmp_path)
    assert named.stdout.startswith("src/c_pb2.py:2:10: AMP004")
    ignored_folder = run_amplint("check", "--output-format", "concise", "generated", cwd=tmp_path)
    assert ignored_folder.stdout.startswith(os.path.join("generated", "a.py") + ":2:10: AMP004")
