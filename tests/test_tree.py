"""The engine's own walk of a libcst tree must see what libcst's visitor sees, minus
whitespace and syntax tokens: the same nodes, in the same order, with the same parents."""

import ast
import dataclasses
import inspect
import sysconfig
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from amplint.engine.tree import Index, child_fields, children, parse
from conftest import ROOT

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = sorted((ROOT / "fixtures").rglob("*.py")) + [
    STDLIB / name for name in ("argparse.py", "dataclasses.py", "typing.py", "inspect.py", "tarfile.py",
                               "asyncio/base_events.py", "json/decoder.py", "unittest/mock.py",
                               "re/_parser.py", "test/test_patma.py", "pydoc.py")]
# Node types that hold no code: whitespace, comments and syntax tokens.
SYNTAX = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline,
          cst.Comment, cst.Comma, cst.Semicolon, cst.Dot, cst.Colon, cst.AssignEqual, cst.LeftParen,
          cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
          cst.RightCurlyBrace, cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp,
          cst.BaseAugOp, cst.Asynchronous, cst.ParamSlash)


def _node_classes():
    seen, todo = set(), [cst.CSTNode]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return sorted((c for c in seen if "_visit_and_replace_children" in c.__dict__ and not inspect.isabstract(c)),
                  key=lambda c: c.__name__)


def _visit_order(kind) -> list[str]:
    """The fields in the order libcst's own visitor visits them: the keyword arguments of the
    node its ``_visit_and_replace_children`` builds."""
    method = ast.parse(textwrap.dedent(inspect.getsource(kind._visit_and_replace_children))).body[0]
    return [kw.arg for node in ast.walk(method) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == kind.__name__ for kw in node.keywords]


@pytest.mark.parametrize("kind", [c for c in _node_classes() if dataclasses.is_dataclass(c)],
                         ids=lambda c: c.__name__)
def test_fields_are_walked_in_libcsts_visit_order(kind):
    walked = child_fields(kind)
    visited = [name for name in _visit_order(kind) if name in walked]
    if visited:  # a few classes build their node another way; the walk test below covers them
        assert list(walked) == visited


class _Reference(cst.CSTVisitor):
    def __init__(self):
        self.order, self.parents, self.stack = [], {}, []

    def on_visit(self, node):
        if isinstance(node, SYNTAX):
            return False
        self.order.append(node)
        self.parents[id(node)] = self.stack[-1] if self.stack else None
        self.stack.append(node)
        return True

    def on_leave(self, original_node):
        if not isinstance(original_node, SYNTAX):  # left even when its visit returned False
            self.stack.pop()


# Every construct whose fields come in an order of their own, in one file.
EXOTIC = """
@decorate(1)
@other
class C[T: int](Base, metaclass=M):
    x: int = 1
    @property
    async def f[U](a, /, b: int = 2, *args, c, d=3, **kw) -> list[U]:
        async with a as b, c:
            async for i in b: yield i if i else -i
        return [j async for j in f(k=1, *x, **y) if j]
type Alias[V] = dict[V, int]
try:
    pass
except* (ValueError, TypeError) as group:
    pass
try:
    x = (y := 1)
except E as e:
    del x
else:
    global g
finally:
    lambda q, *r, s=1: q
match command:
    case [Point(x=0, y=yy), *rest] if yy > 0:
        pass
    case {"k": v, **others} | str() as s:
        pass
print(f"{a!r:>{width}}", x[1:2, ::3], not a, a < b <= c)
"""


@pytest.mark.parametrize("path", FILES + ["exotic"], ids=lambda p: getattr(p, "name", p))
def test_index_equals_libcsts_visitor(path):
    module = cst.parse_module(EXOTIC if path == "exotic" else path.read_text(encoding="utf-8"))
    reference = _Reference()
    module.visit(reference)
    index = Index(module)
    walked = sorted((node for nodes in index.by_type.values() for node in nodes),
                    key=lambda n: index.spans[id(n)][0])
    assert [id(n) for n in walked] == [id(n) for n in reference.order]
    last = {id(n): i for i, n in enumerate(reference.order)}  # rank of the last descendant
    for node in reversed(reference.order):
        parent = reference.parents[id(node)]
        if parent is not None:
            last[id(parent)] = max(last[id(parent)], last[id(node)])
    for position, node in enumerate(reference.order):
        assert index.parents.get(id(node)) is reference.parents[id(node)]
        assert index.spans[id(node)] == [position, last[id(node)]]


@pytest.mark.parametrize("path", FILES[:8] + ["exotic"], ids=lambda p: getattr(p, "name", p))
def test_children_are_libcsts_children_that_hold_code(path):
    module = cst.parse_module(EXOTIC if path == "exotic" else path.read_text(encoding="utf-8"))
    reference = _Reference()
    module.visit(reference)
    for node in reference.order:
        expected = [c for c in node.children if not isinstance(c, SYNTAX)]
        assert [id(c) for c in children(node)] == [id(c) for c in expected], type(node).__name__


@pytest.mark.parametrize("path", FILES[-6:], ids=lambda p: p.name)
def test_parse_without_validation_builds_libcsts_tree(path):
    source = path.read_text(encoding="utf-8")
    assert parse(source).deep_equals(cst.parse_module(source))


def test_nodes_built_after_a_parse_are_validated_again():
    parse("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")
    with pytest.raises(cst.ParserSyntaxError):
        parse("def (:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")


@pytest.mark.parametrize("fixture", ["faulty/train_amp.py", "faulty/gan_trainer.py", "faulty/legacy_trainer.py"])
def test_a_linted_file_leaves_no_cycles_behind(fixture):
    """The engine pauses Python's cycle collector while it checks a file (collections walking a
    growing libcst tree cost a fifth of a run); that is only cheap if the tree is then freed by
    reference counting, with no cycle through the context that holds it. The trainers' scalers
    are followed across their methods (AMP006's inlined flows)."""
    import gc

    from amplint.engine.rule import all_rules
    from amplint.engine.runner import lint_source
    from amplint.policy import loader

    source = (ROOT / "fixtures" / fixture).read_text(encoding="utf-8")
    name = fixture.split("/")[-1]
    lint_source(name, source, list(all_rules()), policy_loader=loader("cuda"))  # warm caches
    gc.collect()
    gc.disable()
    try:
        result = lint_source(name, source, list(all_rules()), policy_loader=loader("cuda"))
        assert result.diagnostics
        del result
        assert gc.collect() < 100
    finally:
        gc.enable()
