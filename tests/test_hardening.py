"""Issue #16: what a hostile repository or a careless user can throw at `amplint check`, on real
git repositories: names that are not UTF-8, special files, commands the repository configures,
fixes on files with many findings."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from amplint.engine import source as source_io
from amplint.cli import main
from amplint.engine.rule import all_rules, rule_by_code
from amplint.engine.runner import lint_source
from conftest import ROOT

FAULTY = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()
FIXED = (ROOT / "fixtures" / "fixed" / "train_amp.py").read_text()
BAD_NAME = os.fsdecode(b"bad\xffname.py")  # not UTF-8: the name's byte 0xff comes back as a surrogate


def _amplint(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "amplint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _git_repo(path):
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    return path


def test_a_file_name_that_is_not_utf8_is_checked_reported_and_fixed(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / BAD_NAME).write_text(FAULTY)
    (repo / ".gitignore").write_text("ignored.py\n")
    (repo / "ignored.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "json", ".", cwd=repo)
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)
    assert {f["filename"] for f in findings} == {"bad\ufffdname.py"}  # git's answer still applied
    assert any(f["code"] == "AMP001" and f["location"] == {"row": 34, "column": 13} for f in findings)
    concise = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=repo)
    assert "bad\ufffdname.py:34:13: AMP001 " in concise.stdout
    fixed = _amplint("check", "--no-cache", "--fix", ".", cwd=repo)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert (repo / BAD_NAME).read_text() == FIXED


def test_checking_a_repository_runs_no_command_its_git_config_names(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / "train.py").write_text(FAULTY)
    subprocess.run(["git", "add", "train.py"], cwd=repo, check=True)  # an index for fsmonitor to refresh
    subprocess.run(["git", "config", "core.fsmonitor", "touch FSMONITOR_RAN; echo"], cwd=repo, check=True)
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    hook = hooks / "post-index-change"
    hook.write_text("#!/bin/sh\ntouch HOOK_RAN\n")
    hook.chmod(0o755)
    # The commands work: git run directly runs both.
    (repo / "train.py").touch()
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, check=True)
    for marker in ("FSMONITOR_RAN", "HOOK_RAN"):
        (repo / marker).unlink()
    (repo / ".gitignore").write_text("generated/\n")
    (repo / "generated").mkdir()
    (repo / "generated" / "g.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=repo)
    assert result.returncode == 1
    assert not (repo / "FSMONITOR_RAN").exists() and not (repo / "HOOK_RAN").exists()
    assert "generated" not in result.stdout and "train.py:34:13: AMP001" in result.stdout  # .gitignore honoured


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_special_files_are_reported_not_read(tmp_path):
    repo = _git_repo(tmp_path)
    (repo / "train.py").write_text(FAULTY)
    os.mkfifo(repo / "f.py")  # reading one blocks until a writer comes: forever
    (repo / "z.py").symlink_to("/dev/zero")  # never ends
    for args in (["."], ["f.py", "z.py", "train.py"]):
        result = _amplint("check", "--no-cache", "--output-format", "concise", *args, cwd=repo, timeout=60)
        assert result.returncode == 2  # files it could not check
        assert "f.py:1:1: AMP999 cannot check f.py: not a regular file (a FIFO)" in result.stdout
        assert "z.py:1:1: AMP999 cannot check z.py: not a regular file (a character device)" in result.stdout
        assert "train.py:34:13: AMP001" in result.stdout  # the others still checked


def test_a_file_over_the_size_cap_is_reported_not_read(tmp_path):
    big = tmp_path / "huge.py"
    with open(big, "wb") as handle:
        handle.truncate(source_io.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    (tmp_path / "train.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "huge.py:1:1: AMP999 cannot check huge.py: larger than 64 MiB; not read" in result.stdout
    assert "train.py:34:13: AMP001" in result.stdout


def test_files_are_read_whole_up_to_the_size_cap(tmp_path, monkeypatch):
    """Reads are sized from the file, so what was read must still be all of it: at the cap
    exactly, and for a file past the size `stat` gave when it was opened (it grew)."""
    at_cap = tmp_path / "at_cap.py"
    with open(at_cap, "wb") as handle:
        handle.truncate(source_io.MAX_FILE_BYTES)
    assert len(source_io.read_file(at_cap)) == source_io.MAX_FILE_BYTES
    text = tmp_path / "long.py"
    text.write_bytes(b"x = 1\n" * 50_000)
    assert source_io.read_file(text) == text.read_bytes()
    real_fstat = os.fstat
    monkeypatch.setattr(source_io.os, "fstat", lambda fd: os.stat_result(
        (*real_fstat(fd)[:6], 10, *real_fstat(fd)[7:])))  # st_size: it was 10 bytes when opened
    assert source_io.read_file(text) == text.read_bytes()


def _training_steps(count: int) -> str:
    step = ("def step_{i}(model, opt, scaler, x):\n"
            "    with torch.autocast(\"cuda\"):\n"
            "        loss = model(x).sum()\n"
            "        scaler.scale(loss).backward()\n"
            "    clip_grad_norm_(model.parameters(), 1.0)\n"
            "    scaler.step(opt)\n"
            "    scaler.update()\n\n")
    return "import torch\nfrom torch.nn.utils import clip_grad_norm_\n\n" + "".join(
        step.format(i=i) for i in range(count))


def test_the_fixes_of_many_findings_in_one_file_all_apply():
    result = lint_source("t.py", _training_steps(30), [rule_by_code("AMP001"), rule_by_code("AMP002")], fix=True)
    fixed_step = ("def step_{i}(model, opt, scaler, x):\n"
                  "    with torch.autocast(\"cuda\"):\n"
                  "        loss = model(x).sum()\n"
                  "    scaler.scale(loss).backward()\n"
                  "    scaler.unscale_(opt)\n"
                  "    clip_grad_norm_(model.parameters(), 1.0)\n"
                  "    scaler.step(opt)\n"
                  "    scaler.update()\n\n")
    assert result.source == "import torch\nfrom torch.nn.utils import clip_grad_norm_\n\n" + "".join(
        fixed_step.format(i=i) for i in range(30))
    assert result.fixes_applied == 60 and result.diagnostics == []


def test_diff_prints_the_diff_alone_with_a_summary_and_exit_code_that_agree(tmp_path):
    # One finding with a safe fix (AMP004), one without (AMP006), whose line the fix would not move.
    source = ("import torch\nscaler = torch.cuda.amp.GradScaler()\nfor x in data:\n"
              "    scaler.scale(model(x)).backward()\n    scaler.step(opt)\n")
    (tmp_path / "train.py").write_text(source)
    result = _amplint("check", "--no-cache", "--diff", "train.py", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+scaler = torch.amp.GradScaler(\"cuda\")" in result.stdout and " AMP0" not in result.stdout
    assert result.stderr == "Would fix 1 finding in 1 file.\n1 finding would remain (run without --diff to see them).\n"
    assert (tmp_path / "train.py").read_text() == source
    (tmp_path / "train.py").write_text(source.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")'))
    nothing = _amplint("check", "--no-cache", "--diff", "train.py", cwd=tmp_path)
    assert nothing.returncode == 0 and nothing.stdout == ""
    assert nothing.stderr.startswith("No fixes to apply (1 file checked).\n1 finding would remain")


def test_force_exclude_applies_the_configured_excludes_to_named_files(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nextend-exclude = ["generated"]\n')
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "g.py").write_text(FAULTY)
    (tmp_path / "train.py").write_text(FAULTY)
    named = ["--no-cache", "--output-format", "concise", "generated/g.py", "train.py"]
    assert "generated/g.py:34:13: AMP001" in _amplint("check", *named, cwd=tmp_path).stdout
    forced = _amplint("check", "--force-exclude", *named, cwd=tmp_path)
    assert forced.returncode == 1 and "generated" not in forced.stdout and "train.py:34:13: AMP001" in forced.stdout


def _without_root_powers() -> list[str]:
    """Root reads any folder: the check runs without that capability then."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: every folder is readable")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_paths_that_cannot_be_read_are_named_and_exit_2(tmp_path):
    (tmp_path / "train.py").write_text(FAULTY)
    (tmp_path / "noread").mkdir()
    (tmp_path / "noread" / "x.py").write_text(FAULTY)
    (tmp_path / "noread").chmod(0)
    try:
        def run(*paths):
            return subprocess.run([*_without_root_powers(), sys.executable, "-m", "amplint", "check", "--no-cache",
                                   "--output-format", "concise", *paths], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120)
        named = run("noread/x.py")
        assert named.returncode == 2 and "Traceback" not in named.stderr
        assert named.stderr.startswith("amplint: error: noread/x.py: cannot access: Permission denied")
        walked = run(".")
        assert walked.returncode == 2
        assert "noread:1:1: AMP999 cannot check noread: cannot list folder: Permission denied" in walked.stdout
        assert "train.py:34:13: AMP001" in walked.stdout
    finally:
        (tmp_path / "noread").chmod(0o755)


def test_the_summary_counts_only_fixes_written(tmp_path):
    (tmp_path / "a.py").write_text(FAULTY)
    (tmp_path / "b.py").write_text(FAULTY)
    (tmp_path / "b.py").chmod(0o444)
    result = _amplint("check", "--no-cache", "--fix", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 2
    a_fixes = result.stderr.split("Fixed ")[1].split(" findings")[0]
    assert "in 1 file." in result.stderr and (tmp_path / "b.py").read_text() == FAULTY
    # b.py's findings are those of the text on disk, at its positions, fixes still offered
    assert "b.py:34:13: AMP001 " in result.stdout and "[*]" in result.stdout
    assert int(a_fixes) > 0


def _github_anchor(heading: str) -> str:
    """GitHub's id for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_docs_rules_md_is_current_and_every_rule_url_lands_on_its_section():
    page = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    result = CliRunner().invoke(main, ["rules", "--format", "markdown"])
    assert result.exit_code == 0
    assert page == result.output, "docs/rules.md is stale: amplint rules --format markdown > docs/rules.md"
    anchors = {_github_anchor(line.lstrip("#")) for line in page.splitlines() if line.startswith("## ")}
    for rule in all_rules():
        assert rule.url().startswith("https://github.com/amplint/amplint/blob/main/docs/rules.md#")
        assert rule.url().rsplit("#", 1)[1] in anchors, rule.code
        assert f"## {rule.code} {rule.name}\n\n{rule.summary}\n" in page


def test_statistics_in_json_and_the_safe_fix_marker(tmp_path):
    # AMP004 has a safe fix; AMP003's is unsafe: only AMP004 is fixable with --fix.
    (tmp_path / "m.py").write_text(
        "import torch\nscaler = torch.cuda.amp.GradScaler()\n\n"
        "class M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x + torch.zeros(3, device=x.device)\n")
    rows = json.loads(_amplint("check", "--preview", "--no-cache", "--statistics", "--output-format", "json", "m.py",
                               cwd=tmp_path).stdout)
    fixable = {row["code"]: row["fixable"] for row in rows}
    assert fixable["AMP004"] is True and fixable["AMP003"] is False
    assert all(set(row) == {"code", "name", "count", "fixable"} and row["count"] == 1 for row in rows)
    text = _amplint("check", "--preview", "--no-cache", "--statistics", "m.py", cwd=tmp_path).stdout
    assert "AMP004\t[*] deprecated-amp-api" in text and "AMP003\ttensor-factory-drops-dtype" in text


def test_the_engine_codes_are_documented():
    for code, name in (("AMP000", "syntax-error"), ("amp999", "internal-error")):
        result = CliRunner().invoke(main, ["rule", code])
        assert result.exit_code == 0 and result.output.startswith(f"# {code.upper()} {name}\n\n")


def test_code_python_accepts_is_checked_however_deep_and_deeper_code_is_a_syntax_error(tmp_path):
    region = 'import torch\nwith torch.autocast("cuda"):\n    y = {}\n    y.backward()\n'
    (tmp_path / "sum.py").write_text(region.format(" + ".join(["x"] * 2000)))  # Python compiles it
    (tmp_path / "parens.py").write_text(region.format("(" * 1000 + "x" + ")" * 1000))  # Python does not
    # deeper than Python's parser goes
    (tmp_path / "huge.py").write_text(region.format(" + ".join(["x"] * 8000)))
    (tmp_path / "train.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert "parens.py:3:209: AMP000 syntax error: too many nested parentheses" in lines
    assert not any(line.startswith("parens.py") and "AMP000" not in line for line in lines)  # no fix offered
    assert [line for line in lines if line.startswith("huge.py")] == [
        "huge.py:1:1: AMP000 syntax error: too deeply nested for Python's parser"]
    assert sorted(line.split(" ")[1] for line in lines if line.startswith("sum.py")) == ["AMP001", "AMP009"]
    assert "train.py:34:13: AMP001" in result.stdout and result.returncode == 1  # findings, no internal error
    assert "KeyError" not in result.stdout and "RecursionError" not in result.stdout


def test_stdin_with_a_file_name_and_its_fixed_text_on_stdout(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nper-file-ignores = {"legacy/*" = ["AMP004"]}\n')

    def run(*args):
        return subprocess.run([sys.executable, "-m", "amplint", "check", "--output-format", "concise", *args],
                              cwd=tmp_path, input=FAULTY, capture_output=True, text=True, timeout=120)

    plain = run("--stdin-filename", "src/train.py", "-")
    assert plain.returncode == 1 and "src/train.py:34:13: AMP001" in plain.stdout and " AMP004 " in plain.stdout
    ignored = run("--stdin-filename", "legacy/train.py", "-")
    assert "legacy/train.py:34:13: AMP001" in ignored.stdout and " AMP004 " not in ignored.stdout
    fixed = run("--fix", "-")
    assert fixed.stdout == FIXED and fixed.returncode == 0  # what --fix leaves has no findings
    assert "Fixed 4 findings in 1 file." in fixed.stderr


def test_output_file_quiet_and_exit_non_zero_on_fix(tmp_path):
    (tmp_path / "train.py").write_text(FAULTY)
    result = _amplint("check", "--no-cache", "-q", "--output-format", "json", "-o", "report.json", ".", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == "" and result.stderr == ""
    assert {f["code"] for f in json.loads((tmp_path / "report.json").read_text())} >= {"AMP001", "AMP002"}
    fixed = _amplint("check", "--no-cache", "--fix", "--exit-non-zero-on-fix", "train.py", cwd=tmp_path)
    assert fixed.returncode == 1 and (tmp_path / "train.py").read_text() == FIXED
    again = _amplint("check", "--no-cache", "--fix", "--exit-non-zero-on-fix", "train.py", cwd=tmp_path)
    assert again.returncode == 0


def test_fix_keeps_a_hard_link_one_file_under_every_name(tmp_path):
    (tmp_path / "src").mkdir()
    train = tmp_path / "src" / "train.py"
    train.write_bytes(FAULTY.replace("\n", "\r\n").encode())  # line endings kept, too
    train.chmod(0o640)
    alias = tmp_path / "alias.py"  # outside the folder checked: fixed through the other name
    os.link(train, alias)
    single = tmp_path / "src" / "single.py"  # one name: replaced by a rename, as before
    single.write_text(FAULTY)
    single_inode = single.stat().st_ino
    result = _amplint("check", "--no-cache", "--fix", "src", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Fixed 8 findings in 2 files." in result.stderr
    for name in (train, alias):
        assert name.read_bytes() == FIXED.replace("\n", "\r\n").encode(), name
    assert train.stat().st_ino == alias.stat().st_ino and train.stat().st_nlink == 2
    assert stat.S_IMODE(train.stat().st_mode) == 0o640
    assert single.read_text() == FIXED and single.stat().st_ino != single_inode
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["single.py", "train.py"]  # nothing left over


def test_fix_of_two_names_of_one_file_in_the_same_run(tmp_path):
    (tmp_path / "a.py").write_text(FAULTY)
    os.link(tmp_path / "a.py", tmp_path / "b.py")
    result = _amplint("check", "--no-cache", "--fix", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "a.py").read_text() == (tmp_path / "b.py").read_text() == FIXED
    assert (tmp_path / "a.py").stat().st_ino == (tmp_path / "b.py").stat().st_ino


def test_a_hard_linked_file_changed_meanwhile_is_not_written(tmp_path):
    path, other = tmp_path / "train.py", tmp_path / "other.py"
    path.write_text("edited by the user\n")
    os.link(path, other)
    with pytest.raises(source_io.ChangedOnDisk, match="changed on disk"):
        source_io.write_atomically(path, b"fixed\n", expected=FAULTY.encode())
    assert path.read_text() == other.read_text() == "edited by the user\n"
    source_io.write_atomically(path, b"fixed\n", expected=b"edited by the user\n")
    assert path.read_text() == other.read_text() == "fixed\n"
    assert path.stat().st_ino == other.stat().st_ino
    # Through a symlink to one of the names: the link stays a link, the file stays linked.
    link = tmp_path / "link.py"
    link.symlink_to(other)
    source_io.write_atomically(link, b"shorter\n", expected=b"fixed\n")
    assert link.is_symlink() and path.read_bytes() == b"shorter\n" and path.stat().st_nlink == 2
    path.chmod(0o444)
    with pytest.raises(PermissionError, match="read-only"):
        source_io.write_atomically(other, b"again\n", expected=b"shorter\n")
    assert other.read_bytes() == b"shorter\n"


@pytest.mark.skipif(not hasattr(os, "link") or sys.platform == "win32", reason="POSIX hard links and rlimits")
def test_a_hard_linked_file_that_cannot_grow_is_left_whole(tmp_path):
    """A file-size limit just above the old text: the longer fixed text cannot be written. The
    file keeps its old text, whole, under both names (and the rename path keeps it too)."""
    import resource
    import signal
    (tmp_path / "linked.py").write_text(FAULTY)
    os.link(tmp_path / "linked.py", tmp_path / "alias.py")
    (tmp_path / "single.py").write_text(FAULTY)
    limit = len(FAULTY.encode()) + 10  # FIXED is longer

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "amplint", "check", "--no-cache", "--fix", "--output-format",
                             "concise", "linked.py", "single.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, preexec_fn=limited)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "linked.py:1:1: AMP999 cannot write fixes to linked.py: " in result.stdout
    assert "single.py:1:1: AMP999 cannot write fixes to single.py: " in result.stdout
    for name in ("linked.py", "alias.py", "single.py"):
        assert (tmp_path / name).read_text() == FAULTY, name
    assert (tmp_path / "linked.py").stat().st_nlink == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.py", "linked.py", "single.py"]
