"""Input a linter meets in the wild and must survive: a rule that crashes, a huge file, two
`--fix` runs racing on one tree."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

FAULTY = (ROOT / "fixtures" / "faulty" / "train_amp.py").read_text()
FIXED = (ROOT / "fixtures" / "fixed" / "train_amp.py").read_text()

# Runs the real CLI with one rule's check replaced by one that raises.
CRASHING_RULE = textwrap.dedent("""
    import sys
    from amplint.engine.rule import rule_by_code
    def boom(self, ctx):
        raise ZeroDivisionError("planted by the test")
    rule_by_code("AMP002").check = boom
    from amplint.cli import main
    main(sys.argv[1:], prog_name="amplint")
""")


def _crashing_cli(*args, cwd):
    return subprocess.run([sys.executable, "-c", CRASHING_RULE, *args], cwd=cwd,
                          capture_output=True, text=True)


def test_a_crashing_rule_is_isolated_named_and_traced_with_verbose(tmp_path):
    (tmp_path / "a.py").write_text(FAULTY)
    (tmp_path / "b.py").write_text(FAULTY)
    result = _crashing_cli("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert result.returncode == 2  # something went wrong, whatever else was found
    internal = [line for line in result.stdout.splitlines() if " AMP999 " in line]
    assert len(internal) == 2 and {line.split(":")[0] for line in internal} == {"a.py", "b.py"}
    assert all("AMP002" in line and "ZeroDivisionError" in line for line in internal)
    # Every other rule still ran on both files.
    for name in ("a.py", "b.py"):
        assert f"{name}:34:13: AMP001 " in result.stdout and f"{name}:31:14: AMP004 " in result.stdout
    assert "Traceback" not in result.stderr
    verbose = _crashing_cli("check", "--no-cache", "--verbose", "a.py", cwd=tmp_path)
    assert "Traceback (most recent call last)" in verbose.stderr
    assert 'ZeroDivisionError: planted by the test' in verbose.stderr and "a.py" in verbose.stderr


def test_a_10_mb_file_is_checked_and_fixed_with_exact_positions(run_amplint, tmp_path):
    # Ten megabytes of data the training script embeds, then the script itself.
    blob = "".join(f"    {i:08d} {'x' * 60}\n" for i in range(150_000))
    source = f'VOCAB = """\n{blob}"""\n' + FAULTY
    assert len(source.encode()) > 10_000_000
    offset = source[: source.index(FAULTY)].count("\n")
    path = tmp_path / "big.py"
    path.write_text(source)
    result = run_amplint("check", "--no-cache", "--output-format", "concise", "big.py", cwd=tmp_path)
    assert result.returncode == 1
    assert f"big.py:{34 + offset}:13: AMP001 " in result.stdout
    fixed = run_amplint("check", "--no-cache", "--fix", "big.py", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout
    assert path.read_text() == f'VOCAB = """\n{blob}"""\n' + FIXED


def test_two_fix_runs_at_once_leave_no_torn_file(tmp_path):
    for i in range(40):
        (tmp_path / f"train_{i:02d}.py").write_text(FAULTY)
    command = [sys.executable, "-m", "amplint", "check", "--fix", "--no-cache", "--jobs", "1", "."]
    runs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)]
    for run in runs:
        run.communicate(timeout=300)
        assert run.returncode in (0, 1)
    for path in sorted(tmp_path.iterdir()):
        assert path.suffix == ".py", f"left behind: {path.name}"  # no temporary files
        text = path.read_text()
        ast.parse(text)
        assert text == FIXED, path.name


def test_form_feeds_and_unicode_separators_do_not_shift_lines(run_amplint, tmp_path):
    # Python ends lines only at \r\n, \r and \n; str.splitlines also splits at \f,
    # \v, \x1c-\x1e, \x85 and \u2028/\u2029, which once moved every position after them.
    source = ("import torch\n\x0c\n# a note\x0b with\x1c separators\u2028inside\n"
              "label = 'x\x85y'\nscaler = torch.cuda.amp.GradScaler()\n")
    path = tmp_path / "ff.py"
    path.write_text(source, encoding="utf-8")
    result = run_amplint("check", "--no-cache", "ff.py", cwd=tmp_path)
    assert result.stdout.startswith("ff.py:5:10: AMP004 ")
    assert "5 | scaler = torch.cuda.amp.GradScaler()\n  |          ^^^^^^^^^^^^^^^^^^^^^^^^^ AMP004" \
        in result.stdout
    fixed = run_amplint("check", "--no-cache", "--fix", "ff.py", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout
    assert path.read_text(encoding="utf-8") == source.replace("torch.cuda.amp.GradScaler()",
                                                              'torch.amp.GradScaler("cuda")')


def test_lone_carriage_returns_keep_noqa_and_line_endings(run_amplint, tmp_path):
    source = ("import torch\rscaler = torch.cuda.amp.GradScaler()  # noqa: AMP004\r"
              "other = torch.cuda.amp.GradScaler()\r")
    path = tmp_path / "mac.py"
    path.write_bytes(source.encode())
    result = run_amplint("check", "--no-cache", "--output-format", "concise", "mac.py", cwd=tmp_path)
    assert [line.split(" ")[0] for line in result.stdout.splitlines()] == ["mac.py:3:9:"]
    run_amplint("check", "--no-cache", "--fix", "mac.py", cwd=tmp_path)
    assert path.read_bytes() == source.replace("other = torch.cuda.amp.GradScaler()",
                                               'other = torch.amp.GradScaler("cuda")').encode()


def test_fix_through_a_symlink_fixes_its_target_and_keeps_the_link(run_amplint, tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "train.py"
    target.write_text(FAULTY)
    link = tmp_path / "train.py"
    link.symlink_to(Path("real") / "train.py")
    run_amplint("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "train.py")
    assert target.read_text() == FIXED


def test_fix_does_not_overwrite_a_file_changed_meanwhile(tmp_path):
    from amplint.engine.source import ChangedOnDisk, write_atomically
    path = tmp_path / "train.py"
    path.write_text("edited by the user\n")
    try:
        write_atomically(path, b"fixed\n", expected=FAULTY.encode())
    except ChangedOnDisk as exc:
        assert "changed on disk" in str(exc)
    else:
        raise AssertionError("the user's edit was overwritten")
    assert path.read_text() == "edited by the user\n"
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temporary file left
    write_atomically(path, b"fixed\n", expected=b"edited by the user\n")
    assert path.read_text() == "fixed\n"


@pytest.mark.parametrize("source", [
    'message = ("a long line"  # noqa: E501\n           "and more")  # noqa: AMP004\n',
    'DOC = """\n# noqa: AMP004 in a docstring is text\n"""\nx = 1  # noqa\n',
    'url = "https://x.org/#noqa"  # noqa: AMP001\nf"{x!r} # noqa"\n',
    'é = "ü#"; y = 2  # NOQA: amp004, AMP001\n',
    'x = 1\r# amplint: noqa\ry = "# noqa"\r',
])
def test_noqa_comments_found_from_the_outline_as_the_tokenizer_finds_them(source):
    """The `# noqa` comments of a file with findings are found from the strings Python's ast
    sees, as tokenizing the file finds them: a `#` inside a string is text, one between the
    parts of a string written over lines is a comment (there the tokenizer answers)."""
    from amplint.engine import noqa
    from amplint.engine.outline import Outline

    by_tokens, by_outline = noqa.parse(source), noqa.parse(source, Outline.parse(source))
    assert (by_outline.whole_file, by_outline.lines) == (by_tokens.whole_file, by_tokens.lines)
    assert by_tokens.lines or by_tokens.whole_file
