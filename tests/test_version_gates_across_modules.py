"""Version gates defined in one module of a project and used in another, through the real CLI
on a project written to disk: the deprecated-API rule (AMP004) is silent where only older
torch runs the code, reports where the branch that newer torch runs is wrong, and its fix
never rewrites the fallback."""

import json

import pytest
from click.testing import CliRunner

from amplint.cli import main

# The project's version helpers, in spellings of their own: each name is a gate because its
# value follows torch.__version__ (or torch's AMP attributes), not because of what it is called.
COMPAT = '''
import torch
from importlib.metadata import version as distribution_version
from packaging.version import Version, parse

TORCH_GE_2_4 = parse(torch.__version__.split("+")[0]) >= parse("2.4")
OLD_TORCH = not TORCH_GE_2_4
TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split(".")[:2])
TORCH_VERSION = Version(torch.__version__)
INSTALLED_TORCH_AT_LEAST_2_4 = Version(distribution_version("torch")) >= Version("2.4.0")
HAS_DEVICE_GENERIC_FWD = hasattr(torch.amp, "custom_fwd")

try:
    _parsed_torch = Version(torch.__version__)
except Exception:  # building the docs without torch
    _parsed_torch = Version("0.0")


def torch_at_least(wanted):
    return Version(torch.__version__) >= Version(wanted)


def torch_release_at_least(major, minor=0):
    return TORCH_VERSION.release >= (major, minor)


def installed_torch():
    global _parsed_torch
    return _parsed_torch


def min_torch(wanted, inclusive=True):
    """Whether the installed torch is at least ``wanted``."""
    if inclusive:
        return installed_torch() >= Version(wanted)
    return installed_torch() > Version(wanted)


def is_main_process():
    import os
    return os.environ.get("RANK", "0") == "0"
'''

# Each spelling: the gate as the caller writes it, what the caller imports. The new-torch
# branch uses a deprecated name on purpose (reported); the fallback uses it legitimately.
SPELLINGS = {
    "boolean": ("from .compat import TORCH_GE_2_4", "TORCH_GE_2_4"),
    "negated_boolean": ("from .compat import OLD_TORCH", "not OLD_TORCH"),
    "helper": ("from .compat import torch_at_least", 'torch_at_least("2.4")'),
    "module_attribute": ("from . import compat", "compat.TORCH_GE_2_4"),
    "module_helper": ("import gated.compat as compat", 'compat.torch_at_least("2.4.0a0")'),
    "release_tuple": ("from gated.compat import TORCH_RELEASE", "TORCH_RELEASE >= (2, 4)"),
    "chained": ("from packaging.version import Version\nfrom .compat import TORCH_VERSION",
                'Version("2.4") <= TORCH_VERSION < Version("99")'),
    "keywords": ("from .compat import torch_release_at_least", "torch_release_at_least(major=2, minor=4)"),
    "distribution": ("from .compat import INSTALLED_TORCH_AT_LEAST_2_4", "INSTALLED_TORCH_AT_LEAST_2_4"),
    "attribute_probe": ("from .compat import HAS_DEVICE_GENERIC_FWD", "HAS_DEVICE_GENERIC_FWD"),
    "cached_global": ("from .compat import min_torch", 'min_torch("2.4.0a0")'),
    "reexported": ("from .utils import TORCH_GE_2_4", "TORCH_GE_2_4"),
}


def _module(gate_import: str, gate: str, new_branch: str) -> str:
    return f"""import torch
{gate_import}

if {gate}:
    {new_branch}
else:
    scaler = torch.cuda.amp.GradScaler()
"""


WRONG = "scaler = torch.cuda.amp.GradScaler()  # runs on new torch"
RIGHT = 'scaler = torch.amp.GradScaler("cuda")'


def _project(tmp_path, new_branch: str):
    root = tmp_path / "proj"
    (root / "gated" / "utils").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "gated"\ndependencies = ["torch>=2.4"]\n')
    (root / "gated" / "__init__.py").write_text("")
    (root / "gated" / "compat.py").write_text(COMPAT)
    (root / "gated" / "utils" / "__init__.py").write_text("from .versions import TORCH_GE_2_4\n")
    (root / "gated" / "utils" / "versions.py").write_text(
        "import torch\nTORCH_GE_2_4 = torch.__version__ >= '2.4'\n")
    for name, (gate_import, gate) in SPELLINGS.items():
        (root / "gated" / f"{name}.py").write_text(_module(gate_import, gate, new_branch))
    return root


def _row(root, name: str, text: str) -> int:
    lines = (root / "gated" / f"{name}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _findings(root, monkeypatch, *extra):
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["check", "--select", "AMP004", "--output-format", "json", "--no-cache",
                                       *extra, "gated"])
    return json.loads(result.output)


def test_gates_from_another_module_keep_the_fallback_silent_and_the_new_branch_checked(tmp_path, monkeypatch):
    root = _project(tmp_path, WRONG)
    found = {(f["filename"].split("/")[-1], f["location"]["row"]) for f in _findings(root, monkeypatch)}
    assert found == {(f"{name}.py", _row(root, name, "new torch")) for name in SPELLINGS}


def test_correct_new_branches_leave_nothing_to_report(tmp_path, monkeypatch):
    root = _project(tmp_path, RIGHT)
    assert _findings(root, monkeypatch) == []


def test_the_fix_rewrites_the_new_branch_and_never_the_fallback(tmp_path, monkeypatch):
    root = _project(tmp_path, WRONG)
    _findings(root, monkeypatch, "--fix", "--unsafe-fixes")
    for name in SPELLINGS:
        lines = (root / "gated" / f"{name}.py").read_text().splitlines()
        assert lines[-3:] == ['    scaler = torch.amp.GradScaler("cuda")  # runs on new torch', "else:",
                              "    scaler = torch.cuda.amp.GradScaler()"], name


@pytest.mark.parametrize("gate_import,gate", [
    ("from .compat import is_main_process", "is_main_process()"),  # not about torch
    ("from .compat import torch_at_least", "torch_at_least(wanted)"),  # an argument not known here
    ("from .missing import TORCH_GE_2_4", "TORCH_GE_2_4"),  # no such module in the project
])
def test_conditions_that_do_not_follow_the_torch_version_decide_nothing(tmp_path, monkeypatch, gate_import, gate):
    root = _project(tmp_path, RIGHT)
    (root / "gated" / "other.py").write_text(_module(gate_import, gate, WRONG))
    found = sorted(f["location"]["row"] for f in _findings(root, monkeypatch)
                   if f["filename"].endswith("other.py"))
    assert found == [_row(root, "other", "if ") + 1, _row(root, "other", "else:") + 1]
