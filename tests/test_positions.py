"""Offsets come from counting characters while the innermost statement around a node is
rendered alone at its indentation, placed by Python's ast line numbers (cheaper than libcst's positions, which track line and column for
every token of the whole file); they must equal libcst's own, for every node, on varied real
code, and the fallback (rendering the whole module) must too."""

import sysconfig
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from amplint.engine.context import FileContext
from amplint.engine.source import split_lines
from conftest import ROOT

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = sorted((ROOT / "fixtures").rglob("*.py")) + [
    STDLIB / name for name in ("argparse.py", "dataclasses.py", "typing.py", "inspect.py", "tarfile.py",
                               "asyncio/base_events.py", "json/decoder.py", "unittest/mock.py")]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_offsets_equal_libcsts_positions(path):
    source = path.read_text(encoding="utf-8")
    module = cst.parse_module(source)
    ctx = FileContext(str(path), source, module)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    starts, offset = [0], 0
    for line in split_lines(source, keepends=True):
        offset += len(line)
        starts.append(offset)
    checked = 0
    for kind in (cst.Call, cst.Name, cst.Attribute, cst.Arg, cst.FunctionDef, cst.ClassDef, cst.With,
                 cst.SimpleStatementLine, cst.If, cst.Float, cst.SimpleString, cst.Decorator, cst.Param,
                 cst.Try, cst.ExceptHandler, cst.Else, cst.For, cst.While, cst.Return, cst.IndentedBlock,
                 cst.SimpleStatementSuite, cst.Lambda):
        for node in ctx.nodes(kind):
            rng = expected[node]
            want = (starts[rng.start.line - 1] + rng.start.column, starts[rng.end.line - 1] + rng.end.column)
            assert ctx.offsets(node) == want, (path.name, kind.__name__, rng)
            assert ctx.line_start(node) == starts[rng.start.line - 1]
            checked += 1
    assert checked > (50 if len(source) > 2000 else 0)  # a package's __init__ may hold only a docstring
    assert "_module_offsets" not in ctx.__dict__, "every statement was placed without the fallback"


@pytest.mark.parametrize("source,falls_back", [
    ("import torch\nx = torch.zeros(3)", True),  # no newline at the end: the statement alone has one
    ("import torch\nx = torch.zeros(3); y = torch.ones(2)\n\n# trailing comment", False),
    ("import torch\r\n@deco\r\nasync def f():\r\n    return torch.zeros(\r\n        3)\r\n", False),
    ("import torch\nif x:\n    y = torch.zeros(3)\n  # a comment the if's block owns\nz = 1\n", False),
    # nested blocks: tabs inside spaces, a comment at column 0 inside a block, `;`, one-line suites
    ("class A:\n    def f(self):\n    \tif x: a = f(1); b = g(2)\n# col 0\n    \telse:\n    \t\treturn h(3); k(4)\n",
     False),
    ('def f():\n    s = """\nno indent\n"""\n    x = a \\\n  + b(1)\n    try:\n        pass\n'
     "    except E as e:\n        g(e)\n    finally:\n        h()\n", False),
    ("def f(p):\n    match p:\n        case [x, *_] if g(x):\n            return h(x)\n        case _:\n            pass\n",
     False),
    ("def f():\n    @deco(1)\n    # between\n    async def g():\n        async with a(b) as c:\n            await c()\n"
     "    while g(): pass\n    else: h()\n", False),
])
def test_offsets_at_the_edges_and_the_fallback(source, falls_back):
    module = cst.parse_module(source)
    ctx = FileContext("t.py", source, module)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    starts, offset = [0], 0
    for line in split_lines(source, keepends=True):
        offset += len(line)
        starts.append(offset)
    for node in ctx.nodes(cst.Call) + ctx.nodes(cst.Name):
        rng = expected[node]
        assert ctx.offsets(node) == (starts[rng.start.line - 1] + rng.start.column,
                                     starts[rng.end.line - 1] + rng.end.column)
    assert ("_module_offsets" in ctx.__dict__) is falls_back


def test_crlf_comments_and_a_header_before_the_first_statement():
    source = "#!/usr/bin/env python\r\n# header\r\n\r\nimport torch\r\nx = torch.zeros(\r\n    3)\r\n"
    module = cst.parse_module(source)
    ctx = FileContext("t.py", source, module)
    call = ctx.nodes(cst.Call)[0]
    start, end = ctx.offsets(call)
    assert source[start:end] == "torch.zeros(\r\n    3)"


def test_a_finding_renders_its_innermost_statement_not_the_class_around_it():
    methods = "".join(f"    def m{i}(self):\n        return torch.zeros({i})\n\n" for i in range(50))
    source = f"import torch\n\nclass Big:\n{methods}"
    ctx = FileContext("t.py", source, cst.parse_module(source))
    call = ctx.nodes(cst.Call)[25]
    start, end = ctx.offsets(call)
    assert source[start:end] == "torch.zeros(25)"
    (rendered,) = ctx.__dict__["_offsets_by_statement"]
    assert rendered == (id(ctx.parent(ctx.parent(call))), False)  # the `return` line alone


def test_a_finding_in_a_header_renders_the_header_not_the_body():
    """A node in a compound statement's header (a `with` item, a decorator, an `if` test) is
    placed from the statement rendered with a one-line body; a node in its `else` is not."""
    body = "".join(f"        y{i} = model(x{i})\n" for i in range(50))
    source = (f"import torch\n\ndef step(model, x, ok):\n    # one region\n    with torch.autocast(\"cuda\"):  # here\n\n{body}"
              "    if ok:\n        pass\n    else:\n        torch.zeros(1)\n")
    ctx = FileContext("t.py", source, cst.parse_module(source))
    autocast, *_, zeros = ctx.nodes(cst.Call)[:1] + [c for c in ctx.nodes(cst.Call) if "zeros" in ctx.module.code_for_node(c)]
    start, end = ctx.offsets(autocast)
    assert source[start:end] == 'torch.autocast("cuda")'
    with_statement = next(a for a in ctx.ancestors(autocast) if isinstance(a, cst.With))
    assert list(ctx.__dict__["_offsets_by_statement"]) == [(id(with_statement), True)]
    start, end = ctx.offsets(zeros)
    assert source[start:end] == "torch.zeros(1)"
    assert "_module_offsets" not in ctx.__dict__
