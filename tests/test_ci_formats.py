"""CI formats checked against their specifications: SARIF against the official 2.1.0 schema
(tests/data/README.md says where it comes from), GitHub annotations against the workflow
command syntax GitHub documents."""

import json
import re
import shutil

import pytest

from conftest import ROOT

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())


def _validate(log: dict) -> None:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def test_sarif_of_every_rule_validates_against_the_official_schema(run_amplint):
    result = run_amplint("check", "--preview", "--output-format", "sarif", "--no-cache", ROOT / "fixtures" / "faulty")
    log = json.loads(result.stdout)
    _validate(log)
    assert log["runs"][0]["columnKind"] == "unicodeCodePoints"  # the columns amplint prints
    results = log["runs"][0]["results"]
    assert len({r["ruleId"] for r in results}) == 20
    fixed = [r for r in results if "fixes" in r]
    assert fixed, "fixable findings carry their fixes"
    replacement = fixed[0]["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert {"deletedRegion", "insertedContent"} <= set(replacement)
    # The validator does reject what the schema forbids.
    results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    with pytest.raises(AssertionError, match="startLine"):
        _validate(log)


def test_sarif_with_no_findings_and_with_engine_errors_validates(run_amplint, tmp_path):
    (tmp_path / "ok.py").write_text("import torch\n")
    empty = json.loads(run_amplint("check", "--output-format", "sarif", "ok.py", cwd=tmp_path).stdout)
    _validate(empty)
    assert empty["runs"][0]["results"] == []
    (tmp_path / "broken.py").write_text("with torch.autocast('cuda'):\n    x = (\n")
    broken = json.loads(run_amplint("check", "--output-format", "sarif", "broken.py", cwd=tmp_path).stdout)
    _validate(broken)
    assert broken["runs"][0]["results"][0]["ruleId"] == "AMP000"


# https://docs.github.com/en/actions/reference/workflows-and-actions/workflow-commands
# `::error file={name},line={line},endLine={endLine},title={title}::{message}`, with col and
# endColumn too; `%`, CR and LF escaped in the message, and also `:` and `,` in properties.
_ANNOTATION = re.compile(r"^::(error|warning|notice) ([^:]*)::(.*)$")
_PROPERTIES = {"file", "line", "endLine", "col", "endColumn", "title"}


def test_github_annotations_follow_the_documented_syntax(run_amplint, tmp_path):
    shutil.copy(ROOT / "fixtures" / "faulty" / "train_amp.py", tmp_path / "train, v2: amp.py")
    result = run_amplint("check", "--output-format", "github", ".", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert lines and result.returncode == 1
    for line in lines:
        match = _ANNOTATION.match(line)
        assert match, line
        props = dict(p.split("=", 1) for p in match.group(2).split(","))
        assert set(props) == _PROPERTIES, line
        assert props["file"] == "train%2C v2%3A amp.py"  # `,` and `:` escaped in a property
        assert all(props[k].isdigit() for k in ("line", "endLine", "col", "endColumn"))
        assert "\n" not in match.group(3) and match.group(3).startswith("AMP0")


def test_sarif_of_a_finding_in_another_file_validates(run_amplint, tmp_path):
    # AMP008 across files: a loss module and the trainer that runs it under CUDA autocast
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "losses.py").write_text(
        "import torch.nn.functional as F\n\n\ndef bce_loss(p, y):\n    return F.binary_cross_entropy(p, y)\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom losses import bce_loss\n\nLOSSES = {'bce': bce_loss}\n\n\n"
        "def step(model, x, y, loss_fn):\n    with torch.autocast('cuda'):\n"
        "        return loss_fn(model(x), y)\n")
    log = json.loads(run_amplint("check", "--preview", "--output-format", "sarif", "--no-cache", "losses.py", cwd=tmp_path).stdout)
    _validate(log)
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "AMP008"
    assert result["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"
