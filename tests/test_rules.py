"""Every rule's own examples: valid code is silent, invalid code reports, fixes are as shown."""

import json

import pytest

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
    compile(fixed.source, path, "exec")
    again = _lint(rule, fixed.source, path, fix=True, unsafe=True)
    assert again.source == fixed.source, "a second --fix changed the file again"


def test_readme_lists_every_rule():
    from conftest import ROOT
    readme = (ROOT / "README.md").read_text()
    for rule in all_rules():
        assert f"| {rule.code} | {rule.name} |" in readme, rule.code


@pytest.mark.parametrize("preview", [True, False])
@pytest.mark.parametrize("rule,kind,index,example", CASES)
def test_prefilter_never_drops_a_finding(rule, kind, index, example, example_path, preview):
    every_rule = list(all_rules())
    path = example_path(example)
    with_filter = lint_source(path, example.code, every_rule, policy_loader=_cuda_tables, preview=preview)
    without = lint_source(path, example.code, every_rule, policy_loader=_cuda_tables, preview=preview,
                          use_prefilter=False)
    assert [(d.code, d.location) for d in with_filter.diagnostics] == \
        [(d.code, d.location) for d in without.diagnostics]


@pytest.mark.parametrize("rule,kind,index,example", [c for c in CASES if c.values[1] == "invalid"])
def test_own_prefilter_lets_every_invalid_example_through(rule, kind, index, example, example_path):
    prefilter = Prefilter([rule], preview=True)  # the examples pin the preview paths too
    hints = ProjectHints(example_path(example))
    assert prefilter.matching(example.code, hints), f"{rule.code}'s fragments miss its own example"


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
    """An autocast region's table and dtype come from its device: every table must know cuda
    and cpu, and accept the per-device classes' default dtypes."""
    from amplint.engine.regions import _PER_DEVICE_DEFAULT_DTYPE
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
    # Outside preview, AMP018 needs the value's float16 shown in the file: a region or a `.half()`.
    ("AMP018", "import torch\ndef f(x: torch.Tensor):\n    return x / (x.norm() + 1e-8)\n", False),
    ("AMP018", "import torch\ndef f(x: torch.Tensor):\n    return x / (x.norm() + 1e-8)\nnet = Net().half()\n", True),
    # AMP009: a backward pass beside autocast or an FSDP policy keyword (else: asked of the project).
    ("AMP009", "def f(model, x):\n    model(x).sum().backward()\n", False),
    ("AMP009", "import torch\nwith torch.autocast('cuda'):\n    loss = model(x)\nloss.backward()\n", True),
    ("AMP009", "fsdp = FSDP(model, mixed_precision=policy)\nfsdp(x).sum().backward()\n", True),
])
def test_fragments_ask_what_the_check_needs(rule_code, code, fires):
    rule = next(r for r in all_rules() if r.code == rule_code)
    assert bool(Prefilter([rule]).matching(code)) is fires


_FACTORY = "import torch\nclass Head(torch.nn.Module):\n    def forward(self, h):\n" \
           "        bias = torch.zeros(h.shape[0], device=h.device)\n        return h + bias\n"


@pytest.mark.parametrize("extra,fires", [
    # A word of a fragment only in prose: a comment, a docstring's example and its continuation.
    ("# keep the bias in float16 under autocast\n", False),
    ('"""Example:\n    >>> net = Net().to(torch.float16)\n    ... net(x.to(torch.float16))\n"""\n', False),
    # In code, after a string that holds a `#`, in a string of code, after `...` as a value.
    ('tag = "#"; net = Net().to(torch.float16)\n', True),
    ('DTYPE = getattr(torch, "float16")\n', True),
    ("PAD = ...; DTYPE = torch.float16\n", True),
    ("# a comment\nnet = Net().to(\n    torch.float16)\n", True),
])
def test_fragment_words_are_found_in_code_only(extra, fires):
    """AMP003 needs a float16 producer, a `.half()` or an autocast region in the file, outside
    preview: a word the file spells only in prose lets nothing through; the same word in code
    does, wherever on its line."""
    amp003 = next(r for r in all_rules() if r.code == "AMP003")
    assert bool(Prefilter([amp003]).matching(_FACTORY + extra)) is fires
    assert Prefilter([amp003], preview=True).matching(_FACTORY + extra) == [amp003]


def test_amp009_asks_its_project_for_a_policy_keyword_its_file_lacks(tmp_path):
    """AMP009 needs a backward pass beside a float16 region or an FSDP precision policy: a file
    with neither passes its fragments only where its project hands a policy to a wrap."""
    from amplint.engine.project_index import ProjectHints, forget

    rule = next(r for r in all_rules() if r.code == "AMP009")
    loop = "def train(model, batch, optimizer):\n    model(batch).loss.backward()\n    optimizer.step()\n"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'lm'\n")
    (tmp_path / "train.py").write_text(loop)
    assert Prefilter([rule]).matching(loop) == []  # no project asked
    forget()
    assert Prefilter([rule]).matching(loop, ProjectHints(tmp_path / "train.py")) == []
    (tmp_path / "shard.py").write_text("from torch.distributed.fsdp import fully_shard\n"
                                       "def shard(m, policy):\n    fully_shard(m, mp_policy=policy)\n")
    forget()
    hints = ProjectHints(tmp_path / "train.py")
    assert Prefilter([rule]).matching(loop, hints) == [rule]
    assert any(d.kind == "keyword:mp_policy" for d in hints.read)  # a cached result depends on it
    forget()


def test_preview_fragments_ask_what_the_preview_paths_need():
    """AMP018's guess that a caller passes float16 needs no producer in the file."""
    rule = next(r for r in all_rules() if r.code == "AMP018")
    code = "import torch\ndef f(x: torch.Tensor):\n    return x / (x.norm() + 1e-8)\n"
    assert Prefilter([rule], preview=True).matching(code) == [rule]


