"""The prefilter keeps every finding on spelling variants of every rule's invalid examples.

A rule's fragments are written apart from its ``check``; these variants (the
same code with other spacing, line breaks and import aliases) are where the two drift apart:
``check`` reads a syntax tree and does not mind them, a regular expression may.
"""

import re
from decimal import Decimal

import libcst as cst
import pytest

from amplint.engine.rule import all_rules, tolerant_of_spacing
from amplint.engine.runner import lint_source
from amplint.policy import loader

_cuda_tables = loader("cuda")


class _SpaceBeforeCallParentheses(cst.CSTTransformer):
    def leave_Call(self, original, updated):
        return updated.with_changes(whitespace_after_func=cst.SimpleWhitespace(" "))


class _ArgumentsOnTheNextLine(cst.CSTTransformer):
    def leave_Call(self, original, updated):
        if not updated.args:
            return updated
        return updated.with_changes(whitespace_before_args=cst.ParenthesizedWhitespace(
            indent=True, last_line=cst.SimpleWhitespace("        ")))


class _SpacesAroundDots(cst.CSTTransformer):
    """`scaler . scale(loss)`: legal, and what a call chain broken over lines amounts to."""

    def leave_Attribute(self, original, updated):
        return updated.with_changes(dot=cst.Dot(whitespace_before=cst.SimpleWhitespace(" "),
                                                whitespace_after=cst.SimpleWhitespace(" ")))


class _ContinuationLines(cst.CSTTransformer):
    """`x \\` + line break + `.float()`: a backslash continues a line between any two tokens;
    here before every attribute's dot and every call's parenthesis."""

    def leave_Attribute(self, original, updated):
        return updated.with_changes(dot=cst.Dot(whitespace_before=cst.SimpleWhitespace(" \\\n    ")))

    def leave_Call(self, original, updated):
        return updated.with_changes(whitespace_after_func=cst.SimpleWhitespace(" \\\n    "))


class _BlanksInEmptyCalls(cst.CSTTransformer):
    """`x.float(  # why\n)`: what Python allows between an empty call's parentheses."""

    def leave_Call(self, original, updated):
        if updated.args:
            return updated
        return updated.with_changes(whitespace_before_args=cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment("# why")),
            indent=True, last_line=cst.SimpleWhitespace("")))


class _FloatsRespelled(cst.CSTTransformer):
    """Every float literal as a fraction times a power of ten (`1e-8` as `0.1e-7`, `0.5` as
    `0.5e0`): the same decimal, so the same float."""

    def leave_Float(self, original, updated):
        value = Decimal(updated.value.replace("_", ""))
        if not value:
            return updated
        _, digits, exponent = value.as_tuple()
        return updated.with_changes(value=f"0.{''.join(map(str, digits))}e{exponent + len(digits)}")


class _ImportsAliased(cst.CSTTransformer):
    """Every imported name bound under another name (`import torch as torch_1`,
    `from torch import float16 as float16_1`), and every use of it renamed."""

    def __init__(self, module: cst.Module):
        self.renamed: dict[str, str] = {}
        self.not_a_use: set[int] = set()
        module.visit(self._Collector(self))

    class _Collector(cst.CSTVisitor):
        def __init__(self, outer):
            self.outer = outer

        def visit_ImportAlias(self, node):
            bound = node.asname.name if node.asname else node.name
            if isinstance(bound, cst.Name):
                self.outer.renamed[bound.value] = f"{bound.value}_1"
                self.outer.not_a_use.add(id(bound))
            return False

        def visit_Attribute(self, node):
            self.outer.not_a_use.add(id(node.attr))

        def visit_Arg(self, node):
            if node.keyword is not None:
                self.outer.not_a_use.add(id(node.keyword))

    def leave_ImportAlias(self, original, updated):
        bound = original.asname.name if original.asname else original.name
        if not isinstance(bound, cst.Name):  # `import torch.nn`: binds `torch`, keep it plain
            return updated
        return updated.with_changes(asname=cst.AsName(name=cst.Name(self.renamed[bound.value])))

    def leave_Name(self, original, updated):
        if id(original) in self.not_a_use or original.value not in self.renamed:
            return updated
        return updated.with_changes(value=self.renamed[original.value])


def _variants(code: str) -> dict[str, str]:
    module = cst.parse_module(code)
    return {"space before call parentheses": module.visit(_SpaceBeforeCallParentheses()).code,
            "arguments on the next line": module.visit(_ArgumentsOnTheNextLine()).code,
            "spaces around dots": module.visit(_SpacesAroundDots()).code,
            "continuation lines": module.visit(_ContinuationLines()).code,
            "blanks in empty calls": module.visit(_BlanksInEmptyCalls()).code,
            "floats respelled": module.visit(_FloatsRespelled()).code,
            "imports aliased": module.visit(_ImportsAliased(module)).code}


CASES = [pytest.param(rule, example, name, variant, id=f"{rule.code}-{i}-{name.replace(' ', '-')}")
         for rule in all_rules()
         for i, example in enumerate(rule.invalid)
         for name, variant in _variants(example.code).items()]


@pytest.mark.parametrize("rule,example,name,variant", CASES)
def test_prefilter_keeps_findings_of_spelling_variants(rule, example, name, variant, example_path):
    compile(variant, "variant.py", "exec")  # the variant is Python
    path = example_path(example)
    with_filter = lint_source(path, variant, [rule], policy_loader=_cuda_tables, preview=True)
    without = lint_source(path, variant, [rule], policy_loader=_cuda_tables, use_prefilter=False, preview=True)
    assert [(d.code, d.location) for d in with_filter.diagnostics] == \
        [(d.code, d.location) for d in without.diagnostics], variant


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.invalid])
def test_spacing_variants_still_report(rule, example_path):
    """The variants are not vacuous: spacing never changes what `check` reads."""
    for example in rule.invalid:
        for name, variant in _variants(example.code).items():
            if name == "imports aliased":
                continue
            found = lint_source(example_path(example), variant, [rule], policy_loader=_cuda_tables, preview=True,
                                use_prefilter=False).diagnostics
            assert [d for d in found if d.code == rule.code], (name, variant)


@pytest.mark.parametrize("fragment,code", [
    (r"scaler\.scale\(", "scaler . scale (loss)"),
    (r"scaler\.scale\(", "y = (scaler.\n     scale\n     (loss))"),
    (r"scaler\.scale\(", "scaler \\\n    .scale \\\n    (loss)"),
    (r"\.float\(\)", "m.float(  # a mask\n)"),
    (r"\.float\(\)", "m.float(\\\n)"),
    (r"\)[\s)]*\.\s*(?:to|cuda)\s*\(", "(torch.zeros(3)) \\\n    .to(device)"),
    (r"from\s+torch\.cuda\s+import[^\n]*\bamp\b", "from \\\n    torch.cuda import (\n    amp)"),
])
def test_fragments_match_the_spellings_python_allows(fragment, code):
    compile(code, "spelled.py", "exec")
    assert re.search(tolerant_of_spacing(fragment), code)
