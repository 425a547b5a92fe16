"""Version gates that cannot be worked out to the end (a helper that parses versions with `re`,
a table of operators, a version helper of another library) but that read the torch version,
choosing between the device-generic AMP API and the deprecated one: the deprecated arm is the
fallback for older torch and AMP004 is silent there. A condition that reads no torch version
(the device, the process) decides nothing, and neither does one whose other arm does not use
the device-generic API. Through the real CLI on a project written to disk."""

import json

import pytest
from click.testing import CliRunner

from amplint.cli import main

# Helpers the evaluator cannot finish: regular expressions, loops, a dict of operators, `raise`.
VERSIONS = '''
import operator
import re
from importlib import metadata

import torch

TORCH_VERSION = torch.__version__
_INSTALLED = metadata.version("torch")
_OPERATORS = {">=": operator.ge, ">": operator.gt, "<": operator.lt}


def release(text):
    return tuple(int(part) for part in re.findall(r"\\d+", text)[:3])


def satisfies(current, wanted):
    ok = True
    for clause in wanted.split(","):
        sign, number = re.match(r"([<>=!]*)([\\d.]+)", clause).groups()
        if sign == ">=" and release(current) < release(number):
            ok = False
    return ok


def torch_is(sign, wanted):
    if sign not in _OPERATORS:
        raise ValueError(f"unknown comparison {sign}")
    return _OPERATORS[sign](release(_INSTALLED), release(wanted))


TORCH_2_4 = satisfies(TORCH_VERSION, ">=2.4.0")
'''

SPELLINGS = {
    "parsed_flag": ("from .versions import TORCH_2_4", "TORCH_2_4"),
    "operator_table": ("from .versions import torch_is", 'torch_is(">=", "2.4")'),
    "chain_unknown_first": ("from .versions import TORCH_VERSION, release",
                            'release("2.4.0") <= release(TORCH_VERSION) < release("99.0")'),
    "negated": ("from .versions import TORCH_2_4", "not (not TORCH_2_4)"),
    "other_library_distribution": ("import operator\nfrom vendor_utils.imports import compare_version",
                                   'compare_version("torch", operator.ge, "2.4.0")'),
    "other_library_requirement": ("from vendor_utils import RequirementCache", 'RequirementCache("torch>=2.4")'),
}

FALLBACK = "scaler = torch.cuda.amp.GradScaler()"


def _module(gate_import: str, gate: str, new_branch: str) -> str:
    return f"""import torch
{gate_import}

if {gate}:
    {new_branch}
else:
    {FALLBACK}
"""


def _project(tmp_path, files: dict[str, str]):
    root = tmp_path / "proj"
    (root / "gated").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "gated"\ndependencies = ["torch>=2.1"]\n')
    (root / "gated" / "__init__.py").write_text("")
    (root / "gated" / "versions.py").write_text(VERSIONS)
    for name, text in files.items():
        (root / "gated" / f"{name}.py").write_text(text)
    return root


def _findings(root, monkeypatch, *extra):
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", "AMP004", "--output-format", "json", "--no-cache",
                                       *extra, "gated"])
    return json.loads(result.output)


def _rows(found, name: str) -> list[int]:
    return sorted(f["location"]["row"] for f in found if f["filename"].endswith(f"/{name}.py"))


def test_an_unfinished_gate_on_the_torch_version_keeps_the_fallback_beside_the_new_api_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {name: _module(i, g, 'scaler = torch.amp.GradScaler("cuda")')
                               for name, (i, g) in SPELLINGS.items()})
    assert _findings(root, monkeypatch) == []
    _findings(root, monkeypatch, "--fix", "--unsafe-fixes")
    for name in SPELLINGS:
        assert (root / "gated" / f"{name}.py").read_text().splitlines()[-1] == f"    {FALLBACK}", name


def test_the_conditional_expression_and_a_fallback_nested_in_a_device_choice(tmp_path, monkeypatch):
    root = _project(tmp_path, {
        "expression": 'import torch\nfrom .versions import TORCH_2_4\n\n'
                      'scaler = torch.amp.GradScaler("cuda") if TORCH_2_4 else torch.cuda.amp.GradScaler()\n',
        "nested": '''import contextlib

import torch
from .versions import TORCH_VERSION, release


@contextlib.contextmanager
def mixed_precision(device_type, enabled=True):
    if release("1.6") <= release(TORCH_VERSION) < release("1.10"):
        if device_type == "cuda":
            with torch.cuda.amp.autocast(enabled=enabled):
                yield
        else:
            yield
    else:
        with torch.autocast(device_type, enabled=enabled):
            yield
'''})
    assert _findings(root, monkeypatch) == []


@pytest.mark.parametrize("gate_import,gate", [
    ("", "torch.cuda.is_available()"),  # the device, not the version
    ("import os", 'os.environ.get("RANK", "0") == "0"'),  # nothing about torch
])
def test_a_condition_that_reads_no_torch_version_decides_nothing(tmp_path, monkeypatch, gate_import, gate):
    root = _project(tmp_path, {"other": _module(gate_import, gate, 'scaler = torch.amp.GradScaler("cpu")')})
    text = (root / "gated" / "other.py").read_text().splitlines()
    assert _rows(_findings(root, monkeypatch), "other") == [text.index(f"    {FALLBACK}") + 1]


def test_without_the_new_api_in_the_other_arm_an_unfinished_gate_decides_nothing(tmp_path, monkeypatch):
    root = _project(tmp_path, {"both": _module("from .versions import TORCH_2_4", "TORCH_2_4",
                                               "scaler = torch.cuda.amp.GradScaler(init_scale=1024)")})
    assert _rows(_findings(root, monkeypatch), "both") == [5, 7]
