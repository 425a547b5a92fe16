"""Version gates evaluated for the torch version in use (the committed tables: torch 2.13), on
real parses of Python's ast."""

import ast

import pytest

from amplint.engine.ast_context import AstContext
from amplint.engine.outline import Outline
from amplint.engine.version_gates import gate_value, version_fallback
from amplint.policy import loader


def _ast_context(source: str, torch_version: str | None = None) -> AstContext:
    return AstContext("t.py", source, Outline.parse(source), loader("cuda", torch_version))


def _gate(source: str, torch_version: str | None = None) -> bool | None:
    """The value of the last `if`'s condition."""
    ctx = _ast_context(source, torch_version)
    last = max((n for n in ast.walk(ctx.outline.tree) if isinstance(n, ast.If)), key=ctx.order)
    return gate_value(ctx, last.test)


@pytest.mark.parametrize("source,expected", [
    # module-level flags from version comparisons
    ("import torch\nfrom packaging import version\n"
     "TORCH_GE_2_4 = version.parse(torch.__version__) >= version.parse('2.4')\nif TORCH_GE_2_4:\n    pass\n", True),
    ("import torch\nfrom packaging.version import Version\n"
     "OLD = Version(torch.__version__.split('+')[0]) < Version('2.3.0')\nif OLD:\n    pass\n", False),
    ("import torch\nfrom distutils.version import LooseVersion\n"
     "if LooseVersion(torch.__version__) >= LooseVersion('1.6.0'):\n    pass\n", True),
    ("import torch\nfrom packaging.version import parse as V\nif V(torch.__version__) < V('1.10.0'):\n    pass\n", False),
    # torch.__version__ compares as a version with strings and tuples; a plain string does not
    ("import torch\nif torch.__version__ >= '2.3':\n    pass\n", True),
    ("import torch\nif torch.__version__ >= (2, 14):\n    pass\n", False),
    ("import torch\nif torch.__version__.split('+')[0] >= '2.3':\n    pass\n", False),  # '2.13.0' < '2.3'
    ("import torch\nif tuple(int(x) for x in torch.__version__.split('.')[:2]) >= (2, 4):\n    pass\n", True),
    ("import torch\nif float(torch.__version__[:3]) >= 2.4:\n    pass\n", False),  # 2.1 < 2.4 on torch 2.13
    ("import torch\nMAJOR, MINOR = 0, 0\nif tuple(map(int, torch.__version__.split('.')[:2])) < (2, 4):\n    pass\n",
     False),
    ("import torch\ntorch_version = torch.__version__.split('+')[0]\nfrom packaging import version\n"
     "if version.parse(torch_version) >= version.parse('2.3.0'):\n    pass\n", True),
    # attributes of torch's AMP API
    ("import torch\nif hasattr(torch, 'amp'):\n    pass\n", True),
    ("import torch\nif hasattr(torch.amp, 'GradScaler'):\n    pass\n", True),
    ("import torch\nif not hasattr(torch.cuda.amp, 'custom_fwd'):\n    pass\n", False),
    ("import torch\nif getattr(torch.amp, 'custom_fwd', None) is not None:\n    pass\n", True),
    ("import torch\nif hasattr(torch.amp, 'some_future_name'):\n    pass\n", None),
    # a helper whose body returns a version comparison
    ("import torch\nfrom packaging import version\n"
     "def torch_version():\n    return torch.__version__.partition('+')[0]\n"
     "def torch_version_ge(major, minor, patch=None):\n"
     "    _version = version.parse(torch_version())\n"
     "    if patch is None:\n        return _version >= version.parse(f'{major}.{minor}')\n"
     "    else:\n        return _version >= version.parse(f'{major}.{minor}.{patch}')\n"
     "if torch_version_ge(2, 4):\n    pass\n", True),
    ("import torch\ndef is_old():\n    return torch.__version__ < '2.4'\nif is_old() or x:\n    pass\n", None),
    # three-valued logic: what does not depend on torch stays unknown
    ("import torch\nif torch.cuda.is_available() and hasattr(torch.cuda.amp, 'autocast'):\n    pass\n", None),
    ("import torch\nif use_amp and torch.__version__ < '2.0':\n    pass\n", False),
    ("import torch\nif use_amp or torch.__version__ >= '2.0':\n    pass\n", True),
    ("if TORCH_GE_2_4:\n    pass\n", None),  # not defined here (imported from elsewhere or a builtin)
    ("import torch\nTORCH_GE: bool = torch.__version__ >= '2.4'\nif TORCH_GE:\n    pass\n", True),
    ("FLAG = not FLAG\nif FLAG:\n    pass\n", None),  # depends on itself
    ("DEBUG = False\nif DEBUG:\n    pass\n", None),  # a constant: no gate on the torch version
    ("import torch\nFLAG = torch.__version__ >= '2.4'\nFLAG = False\nif FLAG:\n    pass\n", None),
    ("import torch\nFLAG = torch.__version__ >= '2.4'\ndef f(FLAG):\n    if FLAG:\n        pass\n", None),
])
def test_gate_value(source, expected):
    assert _gate(source) is expected


def test_a_flag_set_in_both_branches_of_a_gate_takes_the_live_one():
    source = ("try:\n    from torch import GradScaler\n    OLD_SCALER = False\n"
              "except ImportError:\n    from torch.cuda.amp import GradScaler\n    OLD_SCALER = True\n"
              "if OLD_SCALER:\n    pass\n")
    assert _gate(source) is False


def _fallback_lines(source: str) -> list[int]:
    """The lines (1-based) of the simple statements that are version-gated fallbacks."""
    ctx = _ast_context(source)
    return sorted(s.lineno for s in ast.walk(ctx.outline.tree)
                  if isinstance(s, ast.stmt) and not hasattr(s, "body") and version_fallback(ctx, s) is not None)


def test_else_and_elif_branches_of_a_version_gate_are_fallbacks():
    source = """import torch
from typing import TYPE_CHECKING
TORCH_GE_2_4 = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4)
if TYPE_CHECKING:
    autocast = None
elif TORCH_GE_2_4:
    autocast = torch.amp.autocast
else:
    autocast = torch.cuda.amp.autocast
if not TORCH_GE_2_4:
    scaler = torch.cuda.amp.GradScaler()
scaler2 = torch.amp.GradScaler("cuda") if TORCH_GE_2_4 else torch.cuda.amp.GradScaler()
"""
    assert _fallback_lines(source) == [9, 11]
    ctx = _ast_context(source)
    old = sorted((n for n in ast.walk(ctx.outline.tree)
                  if isinstance(n, ast.Attribute) and ctx.code(n) == "torch.cuda.amp.GradScaler"), key=ctx.order)
    assert [version_fallback(ctx, n) is not None for n in old] == [True, True]


def test_except_handlers_around_the_new_api_are_fallbacks():
    source = """import torch
from functools import partial
try:
    from torch.amp import GradScaler
except ImportError:
    from torch.cuda.amp import GradScaler
try:
    fwd = partial(torch.amp.custom_fwd, device_type="cuda")
except (TypeError, AttributeError):
    fwd = torch.cuda.amp.custom_fwd
try:
    import apex
except ImportError:
    scaler = torch.cuda.amp.GradScaler()
try:
    scaler = torch.amp.GradScaler("cuda")
except ValueError:
    scaler = torch.cuda.amp.GradScaler()
"""
    # not the handler of a try that does not use torch.amp, nor one catching something else
    assert _fallback_lines(source) == [6, 10]


def test_the_configured_torch_version_decides():
    source = "import torch\nif torch.__version__ >= '2.4':\n    pass\n"
    assert _gate(source, "2.13") is True
    assert _gate(source, None) is True  # the newest table


def test_each_part_of_a_condition_has_its_value():
    """flow.py asks about each part `not`, `and` and `or` join: `use_amp` is no gate, and the
    parts that only read the torch version are."""
    source = ("import torch\nOLD = torch.__version__ < '2.0'\nNEW = torch.__version__ >= '2.4'\n"
              "if True:\n    pass\nelif OLD and use_amp and NEW or not (NEW and OLD):\n    pass\n")
    ctx = _ast_context(source)
    test = [n for n in ast.walk(ctx.outline.tree) if isinstance(n, ast.If)][1].test
    both, negated = test.values  # (OLD and use_amp and NEW), not (NEW and OLD)
    assert gate_value(ctx, test) is True
    assert gate_value(ctx, both) is False
    assert [gate_value(ctx, part) for part in both.values] == [False, None, True]
    assert gate_value(ctx, negated) is True
    assert gate_value(ctx, negated.operand) is False
    assert [gate_value(ctx, part) for part in negated.operand.values] == [True, False]
