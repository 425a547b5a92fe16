"""Every rule's own examples: valid code is silent, invalid code reports, fixes are as shown."""

import json

import libcst as cst
import pytest

from amplint.engine.outline import Outline
from amplint.engine.project_index import ProjectHints
from amplint.engine.rule import all_rules
from amplint.engine.runner import Prefilter, lint_source
from amplint.policy import loader

CASES = [pytest.param(rule, kind, i, example, id=f"{rule.code}-{kind}-{i}")
         for rule in all_rules()
         for kind, examples in (("valid", rule.valid), ("invalid", rule.invalid))
         for i, example in enumerate(examples)]


def _lint(rule, code, path="example.py", **kw):
    # A rule's examples pin every path of it, those only preview mode reports included.
    return lint_source(path, code, [rule], policy_loader=_cuda_tables, preview=True, **kw)


_cuda_tables = loader("cuda")


def test_every_rule_has_examples_and_docs():
    for rule in all_rules():
        assert rule.valid and rule.invalid, rule.code
        doc = rule.documentation()
        for section in ("## What it does", "## Why is this bad?", "## Example", "## Fix",
                        "## Fix safety", "## False positives"):
            assert section in doc, (rule.code, section)
        assert rule.fixable == any(i.fixed is not None for i in rule.invalid), rule.code


@pytest.mark.parametrize("rule,kind,index,example", CASES)
def test_rule_example(rule, kind, index, example, example_path):
    path = example_path(example)
    result = _lint(rule, example.code, path)
    own = [d for d in result.diagnostics if d.code == rule.code]
    assert all(d.code == rule.code for d in result.diagnostics), result.diagnostics
    if kind == "valid":
        assert own == []
        return
    assert example.at, f"{rule.code}: an Invalid example states where each finding is (at=...)"
    assert [(d.location.row, d.location.column) for d in own] == [(r, c) for r, c, _ in example.at], own
    for d, (_, _, part) in zip(own, example.at):
        assert part in d.message, (part, d.message)
    fixed = _lint(rule, example.code, path, fix=True, unsafe=True)
    if example.fixed is None:
        assert all(d.fix is None for d in own)
        assert fixed.source == example.code
        return
    assert fixed.source == example.fixed
    cst.parse_module(fixed.source)
    again = _lint(rule, fixed.source, path, fix=True, unsafe=True)
    assert again.source == fixed.source, "a second --fix changed the file again"


def test_readme_lists_every_rule():
    from conftest import ROOT
    readme = (ROOT / "README.md").read_text()
    for rule in all_rules():
        assert f"| {rule.code} | {rule.name} |" in readme, rule.code


@pytest.mark.parametrize("rule,kind,index,example", CASES)
def test_prefilter_never_drops_a_finding(rule, kind, index, example, example_path):
    every_rule = list(all_rules())
    path = example_path(example)
    with_filter = lint_source(path, example.code, every_rule, policy_loader=_cuda_tables, preview=True)
    without = lint_source(path, example.code, every_rule, policy_loader=_cuda_tables, preview=True,
                          use_prefilter=False)
    assert [(d.code, d.location) for d in with_filter.diagnostics] == \
        [(d.code, d.location) for d in without.diagnostics]


@pytest.mark.parametrize("rule,kind,index,example", [c for c in CASES if c.values[1] == "invalid"])
def test_own_prefilter_lets_every_invalid_example_through(rule, kind, index, example, example_path):
    prefilter = Prefilter([rule])
    hints = ProjectHints(example_path(example))
    assert prefilter.matching(example.code, hints), f"{rule.code}'s fragments miss its own example"
    assert prefilter.select_with_outline(example.code, hints)[0], f"{rule.code}'s may_fire misses its own example"


def test_banned_op_fragment_covers_every_table():
    from amplint.policy import PolicyTable, policy_dir
    amp008 = next(r for r in all_rules() if r.code == "AMP008")
    paths = sorted(policy_dir().glob("*/*.json"))
    assert paths
    for path in paths:
        for spelling in PolicyTable(json.loads(path.read_text())).spellings_with("banned"):
            code = f"with torch.autocast('cuda'):\n    {spelling}(x)\n"
            assert Prefilter([amp008]).matching(code), (path.name, spelling)


def test_every_table_knows_cuda_and_cpu_and_their_default_dtypes():
    """AMP011's may_fire lets an autocast call through only if it names another device or a
    dtype: every table must know cuda and cpu, and accept the per-device classes' dtypes."""
    from amplint.engine.semantics import _PER_DEVICE_DEFAULT_DTYPE
    from amplint.policy import committed_tables
    tables = committed_tables()
    assert tables
    for table in tables:
        assert {"cuda", "cpu"} <= set(table.autocast_devices), table.device
        if table.device in _PER_DEVICE_DEFAULT_DTYPE:
            assert _PER_DEVICE_DEFAULT_DTYPE[table.device] in table.supported_dtypes


@pytest.mark.parametrize("code,found", [
    ("torch.zeros(3, device=x.device, dtype=x.dtype)", True),
    ("torch.zeros(\n    (b, len(x)),  # (batch, tokens)\n    dtype=h[:, 0].dtype,\n    device=h.device,\n)", True),
    ("torch.ones(n, dtype=next(self.parameters()).dtype, device=x.device)", True),
    ("torch.zeros(f(dtype=x.dtype))", False),  # the keyword of another call
    ("torch.zeros(n).to(dtype=x.dtype)", False),
])
def test_call_fragment_reads_the_call_own_arguments(code, found):
    amp020 = next(r for r in all_rules() if r.code == "AMP020")
    assert bool(Prefilter([amp020]).matching("def forward(self, x):\n    " + code)) is found


@pytest.mark.parametrize("rule_code,code,fires", [
    # AMP003: a float32 maker placed on a device, and a place where two values meet.
    ("AMP003", "import torch\nclass M:\n    def forward(self, x):\n        return x + torch.zeros(3, device=x.device)\n", True),
    # A sum outside a model meets a half value only where the file makes one.
    ("AMP003", "import torch\ndef f(x):\n    return x + torch.zeros(3, device=x.device)\n", False),
    ("AMP003", "import torch\ndef f(x):\n    return x.half() + torch.zeros(3, device=x.device)\n", True),
    ("AMP003", "import torch\ndef f(x, idx):\n    out = torch.zeros(3).to(x.device)\n    out[idx] = x\n", True),
    # An index-put needs an index that is a tensor: not a plain parameter (a position copies
    # into a slice, which casts), nor a float32 value put into a float32 one.
    ("AMP003", "import torch\ndef f(x, i):\n    out = torch.zeros(3).to(x.device)\n    out[i] = x\n", False),
    ("AMP003", "import torch\ndef f(x, idx):\n    out = torch.zeros(3).to(x.device)\n    out[idx] = x.float()\n", False),
    # No device (a CPU tensor), a dtype asked for, nowhere to meet, **kwargs, data in a variable.
    ("AMP003", "import torch\ndef f(x):\n    return x + torch.zeros(3)\n", False),
    ("AMP003", "import torch\ndef f(x):\n    return x + torch.zeros(3, device=x.device, dtype=torch.long)\n", False),
    ("AMP003", "import torch\ndef f(x):\n    return torch.zeros(3, device=x.device)\n", False),
    ("AMP003", "import torch\ndef f(x):\n    return x + torch.zeros(3, device=x.device, **kw)\n", False),
    ("AMP003", "import torch\ndef f(x, data):\n    return x + torch.tensor(data, device=x.device)\n", False),
    # A factory by torch's name from another package, given a device.
    ("AMP003", "from lib import zeros\ndef f(x, idx):\n    out = zeros(3, device=x.device)\n    out[idx] = x\n", True),
    # `.float()` of integers (not of a value of unknown type) where an op needs equal dtypes.
    ("AMP003", "def f(x, m):\n    return x + m.float()\n", False),
    ("AMP003", "def f(x, i, m):\n    x.scatter_add_(1, i, m.float())\n", False),
    ("AMP003", "def f(x, i, m):\n    x.scatter_add_(1, i, (m > 0).float())\n", True),
    # AMP020: `dtype=x.dtype` with `device=x.device`, in a forward or with autocast.
    ("AMP020", "import torch\nclass M:\n    def forward(self, x):\n        return torch.zeros(3, device=x.device, dtype=x.dtype)\n", True),
    ("AMP020", "import torch\ndef helper(x):\n    return torch.zeros(3, device=x.device, dtype=x.dtype)\n", False),
    ("AMP020", "def f(x):\n    from torch import autocast as ac, zeros\n    with ac('cuda'):\n        return zeros(3, device=x.device, dtype=x.dtype)\n", True),
    # AMP016: a torch.optim optimizer and a backward pass.
    ("AMP016", "import torch\nmodel.half()\nopt = torch.optim.SGD(model.parameters())\n", False),
    ("AMP016", "import torch.optim as optim\nmodel.half()\nopt = optim.SGD(model.parameters())\n"
               "loss.backward()\n", True),
    # AMP018: a float below 2**-24; 1e-6 is not one, 1e-8 and 0.0000000_1 are.
    ("AMP018", "import torch\nwith torch.autocast('cuda'):\n    y = x + 1e-6\n", False),
    ("AMP018", "import torch\nwith torch.autocast('cuda'):\n    y = x + 1e-8\n", True),
    ("AMP018", "import torch\nwith torch.autocast('cuda'):\n    y = x + 0.0000000_1\n", True),
    # Outside regions: a public function on a `Tensor` that guards its own division, log or root.
    ("AMP018", "import torch\ndef f(x: torch.Tensor):\n    return x / (x.norm() + 1e-8)\n", True),
    ("AMP018", "import torch\ndef _f(x: torch.Tensor):\n    return x / (x.norm() + 1e-8)\n", False),
    ("AMP018", "import torch\ndef f(x: torch.Tensor):\n    return x.norm()\ndef g(x):\n    return x / (x + 1e-8)\n",
     False),
])
def test_may_fire_reads_the_ast(rule_code, code, fires):
    rule = next(r for r in all_rules() if r.code == rule_code)
    assert Prefilter([rule]).search(code) is fires


_SCATTERED = "def pool(x, ids, h):\n{}\n    x.scatter_add_(1, ids, {})\n"


@pytest.mark.parametrize("body,cast,kept", [
    # What may hold integers, however it is spelled: kept.
    ("    pass", "(ids > 0).float()", True),
    ("    keep = (\n        ids\n        >= 0\n    )", "keep.float()", True),
    ("    a = keep = ids >= 0", "keep.float()", True),
    ("    keep: torch.Tensor = ids.ne(0)", "keep.float()", True),
    ("    m = ids > 0\n    keep = m[:, 1:]", "keep.float()", True),
    ("    m = ids > 0", "m.view(-1)\n        .float()", True),
    ("    m = ids > 0", "m[ids]  # the kept ones\n        .float()", True),
    ("    pass", "ids.argmax(-1).float()", True),
    ("    pass", "(\n        ids == h\n    ).float()", True),
    ("    keep = ((ids > 0))", "(keep).float()", True),
    ("    keep = f(ids), ids.ne(0)", "(keep).float()", False),
    # An attribute, a call that makes no integers, a name given floats only, text in a
    # string, a return annotation's arrow: dropped.
    ("    pass", "self.mask.float()", False),
    ("    pass", "h.cpu().float()", False),
    ("    w = h * 2\n    w = w.view(-1)", "w.float()", False),
    ("    w = [i for i in ids if i > 0]", "w.float()", False),
    ("    pass", "(h / h.sum(dim=ids > 0)).float()", False),
    ("    print('see `.float()` in the docs')", "h", False),
    # Arithmetic at the top of the value, whatever its operands: dropped; a comparison of
    # arithmetic: kept.
    ("    n = (ids < 3).sum(dim=-1) + 1", "n.float()", False),
    ("    n = (h + 1).tanh() * 2 - h", "n.float()", False),
    ("    n = -(ids > 0)", "n.float()", False),
    ("    n = ids + 1 > h", "n.float()", True),
    ("    n = ~(ids > 0)", "n.float()", True),
    ("    def norm(v: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:\n        return v", "v.float()", False),
])
def test_amp003_reads_the_receivers_of_float_in_the_text(body, cast, kept):
    """AMP003's `.float()` group asks the text whether some `.float()` may cast integers, as
    its ast test would (which agrees on every case here: the text may say yes where the ast
    says no, never the reverse)."""
    amp003 = next(r for r in all_rules() if r.code == "AMP003")
    code = _SCATTERED.format(body, cast)
    compile(code, "case.py", "exec")
    assert bool(Prefilter([amp003]).matching(code)) is kept
    assert amp003.may_fire(Outline.parse(code)) is kept


@pytest.mark.parametrize("code,kept", [
    # A tiny epsilon added or clamped, directly or through a name, over lines: kept.
    ("def f(x):\n    return x / (x.norm() + 1e-8)\n", True),
    ("def f(x):\n    return x.log(\n        (1e-10)\n        + x.abs())\n", True),
    ("def f(x, eps=1e-8):\n    return x / (eps + x.sum())\n", True),
    ("EPS: float = 0.0000000_1\ndef f(x):\n    return (x.sum() +  # guarded\n        EPS).sqrt()\n", True),
    ("import torch\ndef f(p):\n    return torch.log(torch.clamp(p, min=1e-12))\n", True),
    ("import torch\nfrom torch import clamp as c\ndef f(p, eps=1e-9):\n    return torch.log(c(p, eps))\n", True),
    ("import torch\ndef f(p):\n    eps = (\n        1e-12\n    )\n    return torch.log(p.clamp(min=(eps)))\n", True),
    # Tiny literals only as settings, in text, or not tiny at all: dropped.
    ("import torch\nnorm = torch.nn.LayerNorm(8, eps=1e-12)\nopt = Adam(params, eps=1e-8)\n", False),
    ("def f(x):\n    '''Scales x (1e-8 would underflow)'''\n    return x * 2  # eps 1e-8\n", False),
    ("def f(x, eps=1e-6):\n    return x / (x.norm() + eps)\n", False),
    ("def f(x, eps=1e-8):\n    return x / (x.norm() + self.eps)\n", False),
])
def test_amp018_reads_guards_in_the_text(code, kept):
    """AMP018 asks the text of a file that opens no region whether a tiny epsilon may guard
    something, as its ast test does (which agrees here: the text may say yes where the ast
    says no, never the reverse)."""
    from amplint.rules.amp018_epsilon_underflows_in_fp16 import _may_guard_tiny
    import ast
    from amplint.rules import amp018_epsilon_underflows_in_fp16 as amp018
    compile(code, "case.py", "exec")
    outline = Outline.parse(code)
    tiny = [c for c in outline.nodes(ast.Constant) if type(c.value) is float and 0 < c.value < amp018.FP16_SMALLEST]
    assert bool(tiny and amp018._guarded_epsilons(outline, tiny, amp018._TinyNames(outline, tiny))) is kept
    assert _may_guard_tiny(code) is kept


@pytest.mark.parametrize("code,kept", [
    ("t = torch.tensor([0.5, 1], device=d)", True),
    ("t = torch.tensor([0, 1], device=d)", False),  # int64
    ("t = torch.tensor([True], device=d)", False),
    ("t = torch.tensor(values, device=d)", False),  # not a list or tuple: not known to be float
    ("t = torch.tensor((n / 2,), device=d)", True),
    ("t = torch.tensor([float(n)], device=d)", True),
    ("t = torch.tensor([math.pi], device=d)", True),
    ("t = torch.tensor([x.norm().item()], device=d)", True),  # an attribute of a call
    ("t = torch.tensor(data=[1e-3], device=d)", True),
    ("t = torch.tensor([[1, 2],\n                  [3, 4]], device=d)", False),
    ("t = torch.tensor([1, 2]).to(d)", False),
    ("t = torch.tensor([1., 2]).cuda()", True),
    ("t = torch.full((n, 2), 0, device=d)", False),
    ("t = torch.full((n, 2), -1.0, device=d)", True),
    ("t = torch.full(size=(n,), fill_value=float('-inf'), device=d)", True),  # a quote: unsure
    ("t = torch.full((n,), fill_value=n / 2, device=d)", True),
    ("t = torch.zeros((), device=d)", False),  # 0-dim
    ("t = torch.zeros([], device=d)", False),
    ("t = torch.zeros((n,), device=d)", True),
    ("t = torch.ones(n, device=d)  # a comment after the call", True),
])
def test_amp003_factory_text_tests_read_data_and_fill(code, kept):
    """The text tests at the end of AMP003's factory groups ask ``_may_make_float32`` of the
    calls the fragments find: a `tensor` whose data may hold a float, a `full` whose fill may
    be one, a factory of a non-empty size. Each case is asked of the ast test too (the text
    test may say yes where it says no, never the reverse)."""
    import ast
    from amplint.rules.amp003_tensor_factory_drops_dtype import _may_make_float32, _may_move_float32, \
        _may_place_float32
    source = "import math\nimport torch\n" + code + "\n"
    compile(source, "case.py", "exec")
    outline = Outline.parse(source)
    call = next(c for c in outline.nodes(ast.Call) if getattr(c.func, "attr", None) in ("tensor", "full", "zeros", "ones"))
    assert _may_make_float32(outline, call) is kept
    assert (_may_place_float32(source) or _may_move_float32(source)) is kept


@pytest.mark.parametrize("code,kept", [
    ("out = torch.zeros(2 ** n, device=x.device)", True),  # a power is not `**kwargs`
    ("out = torch.zeros(*shape, device=x.device)", False),
    ("out = torch.zeros(n, **kw, device=x.device)", False),
    ("out = torch.zeros(n).to(x.device)", True),
    ("out = torch.zeros(n).to(dtype)", True),  # a name may hold a device
    ("out = torch.zeros(n).to(\n    x.dtype\n)", False),
    ("out = torch.zeros(n).to(x.device, torch.float16)", False),
    ("out = torch.zeros(n).to(device=d, dtype=t)", False),
    ("out = torch.zeros(n).to(x.dtype if same else x.device)", True),
    ("out = torch.ones(n).cuda()", True),
])
def test_amp003_factory_fragments_read_the_arguments(code, kept):
    """AMP003's factory fragments leave out what its ast test would: a factory given `*args`
    or `**kwargs`, and one moved by a `.to(...)` that may change its dtype."""
    amp003 = next(r for r in all_rules() if r.code == "AMP003")
    assert bool(Prefilter([amp003]).matching("import torch\ndef f(x, n, d, t, shape, kw, dtype, same):\n    "
                                             + code.replace("\n", "\n    ") + "\n")) is kept
