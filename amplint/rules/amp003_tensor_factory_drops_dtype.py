from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import partial

from ..engine.activations import (ACTIVATION, FLOAT32, GUESSED_KINDS, HALF, HALF_KINDS, PROJECT_HALF, STRICT_METHODS,
                                  Activations, Value, argument_values, bound_before, callee_name, float32_makers,
                                  in_model, index_puts, lower_precision_operands, modules_made_half, promoting_ops,
                                  recurrent_calls, strict_calls)
from ..engine.ast_context import AstContext
from ..engine.crossfile import named_loss_place
from ..engine.diagnostics import Related
from ..engine.dtypes import factory
from ..engine.enabling import region_switch
from ..engine.factories import (MOVED_WITHOUT_DTYPE, PLACED_WITHOUT_DTYPE, parenthesized_code, placed_on_device,
                                 same_dtype_fix)
from ..engine.regions import reaching_region
from ..engine.rule import AnyOf, Invalid, Rule, Valid

_PROMOTING = {ast.Add: "adds it to", ast.Sub: "subtracts", ast.Mult: "multiplies it with", ast.Div: "divides"}
_HALF_NOTE = ", which is float16/bfloat16 in a half model or under autocast"


@dataclass(frozen=True)
class _Meeting:
    node: ast.AST  # where they meet
    origin: ast.Call  # the float32 value's maker
    other: ast.expr | None  # the half value (None: a half module)
    text: str  # what happens there, for the message
    related: tuple[Related, ...] = ()  # another file the half value's dtype comes from
    guessed: bool = False  # the half value's kind is one of GUESSED_KINDS (see check)


def _float_cast(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "float"


def _float32_origin(value: Value, strict: bool) -> ast.Call | None:
    """The reportable maker of a float32 value: a factory, or (where the op needs equal dtypes)
    a `.float()` of integers."""
    if value.kind != FLOAT32 or value.origin is None:
        return None
    return value.origin if strict or not _float_cast(value.origin) else None


def _half_note(flow: Activations, node: ast.AST, value: Value) -> tuple[str, tuple[Related, ...]]:
    """Why the other value is half, for the message, and the other file that says so."""
    if value.kind != PROJECT_HALF:
        return _HALF_NOTE, ()
    _, where, related = flow.project_region()
    return (f", which is float16/bfloat16 when {named_loss_place(flow.ctx, node)} runs under the autocast "
            f"this project enables ({where})"), (related,)


def _meetings(flow: Activations, within: set[int]) -> list[_Meeting]:
    """Where a float32 value meets a half one, in the functions ``within`` (``outline.scopes``)."""
    ctx, scopes = flow.ctx, flow.ctx.outline.scopes
    found: list[_Meeting] = []
    code = partial(parenthesized_code, ctx)  # as the message shows a value

    def strict(node, dest, source, verb):
        d, s = flow.value(dest), flow.value(source)
        if _float32_origin(d, True) is not None and s.kind in HALF_KINDS:
            note, related = _half_note(flow, node, s)
            found.append(_Meeting(node, d.origin, source, f"{verb} `{code(source)}` into it{note}", related,
                                  s.kind in GUESSED_KINDS))
        elif _float32_origin(s, True) is not None and d.kind in HALF_KINDS:
            note, related = _half_note(flow, node, d)
            found.append(_Meeting(node, s.origin, dest, f"{verb} it into `{code(dest)}`{note}", related,
                                  d.kind in GUESSED_KINDS))

    def promoting(node, operands, verb):
        values = [flow.value(o) for o in operands]
        if all(_float32_origin(v, False) is None for v in values) or flow.cast_back(node):
            return
        # Outside a model, only a value the code makes half is known to be half.
        half = HALF_KINDS if in_model(ctx, node) else (HALF,)
        for value in values:
            other = next(((o, v) for o, v in zip(operands, values) if v.kind in half), None)
            if _float32_origin(value, False) is not None and other is not None:
                note, related = _half_note(flow, node, other[1])
                found.append(_Meeting(node, value.origin, other[0], f"{verb} `{code(other[0])}`{note}", related,
                                      other[1].kind in GUESSED_KINDS))

    for node, dest in index_puts(ctx, within):
        strict(node, dest, node.value, "index-puts")
    for call, dest, source, method in strict_calls(ctx, within):
        strict(call, dest, source, f"`{method}`s")
    for node, operands in promoting_ops(ctx, within):
        promoting(node, operands, _PROMOTING[type(node.op)] if isinstance(node, ast.BinOp) else "concatenates it with")
    for call, tensor, states in (r for r in recurrent_calls(ctx) if scopes[id(r[0])] in within):
        # Autocast casts an RNN's state with its input; a half model does not.
        kind = flow.value(tensor).kind if tensor is not None else None
        for value in map(flow.value, states):
            if _float32_origin(value, False) is not None and kind in (HALF, ACTIVATION):
                found.append(_Meeting(call, value.origin, tensor, f"passes it to `{ctx.code(call.func)}` as the state "
                                      f"of `{code(tensor)}`{_HALF_NOTE}", guessed=kind in GUESSED_KINDS))
    calls = sorted((c for c in ctx.outline.nodes(ast.Call) if scopes[id(c)] in within), key=ctx.order)
    for node in [*calls, *sorted((b for b in ctx.outline.nodes(ast.BinOp) if scopes[id(b)] in within), key=ctx.order)]:
        operands = lower_precision_operands(ctx, node)
        values = [flow.value(o) for o in operands]
        if not any(_float32_origin(v, False) is not None for v in values):
            continue
        # Autocast casts both operands; in a half model the op fails on mixed dtypes.
        half = (HALF, ACTIVATION) if in_model(ctx, node) else (HALF,)
        other = next(((o, v) for o, v in zip(operands, values) if v.kind in half), None)
        for value in values:
            if _float32_origin(value, False) is not None and other is not None:
                name = "@" if isinstance(node, ast.BinOp) else callee_name(node)
                found.append(_Meeting(node, value.origin, other[0], f"multiplies it with `{code(other[0])}` "
                                      f"(`{name}`){_HALF_NOTE}", guessed=other[1].kind in GUESSED_KINDS))
    made_half = modules_made_half(ctx)
    for call in calls if made_half else ():
        half_at = made_half.get(ctx.code(call.func))
        if half_at is None or ctx.order(half_at) > ctx.order(call):
            continue
        for arg in argument_values(call):
            value = flow.value(arg)
            if _float32_origin(value, True) is not None:
                found.append(_Meeting(call, value.origin, None, f"passes it to `{ctx.code(call.func)}`, made half "
                                      f"on line {half_at.lineno}"))
    return sorted(found, key=lambda m: ctx.order(m.node))


class TensorFactoryDropsDtype(Rule):
    """
    ## What it does
    Finds a float32 tensor that meets the activations: a tensor factory
    (`torch.zeros/ones/empty/full/tensor/rand/randn`) given a device but no `dtype=`, or
    `.float()` of a mask or of integers, that is then index-put or scattered into, scattered
    or index-put into an activation, concatenated, added to or multiplied with one (in a
    module's method or an autocast region), given to an `nn.LSTM`/`GRU`/`RNN` as its initial
    state, or passed to a module the file made half (`model.half()`). An activation is a
    value whose dtype follows the model's: a tensor argument, a module's output, what a
    `lower_precision_fp` op (`F.linear`, `@`) makes under autocast, a `.half()` tensor, and
    what is computed from those. In a loss (a function or class named like one, or in a module
    named so) of a project that enables autocast in another file (a trainer's `with
    torch.autocast(...)`, a framework's precision setting), what the loss's model returns
    (`self.model(tokens)`: a callable attribute that is no method of the class and is not
    named like a loss or criterion) is half too, whatever it is given: the message names that
    autocast.

    ## Why is this bad?
    Without `dtype=` a factory makes float32 (the default dtype), whatever the model runs in.
    In a `.half()`/bf16 model or under autocast the activations are float16 or bfloat16:
    index-puts and scatters then fail ("Index put requires the source and destination dtypes
    match", "scatter(): Expected self.dtype to be equal to src.dtype"), and `torch.cat`, `+`,
    `*` silently promote the result to float32, doubling memory and time, until an op that
    needs equal dtypes fails ("expected scalar type Half but found Float").

    ## Example
    ```python
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, x.shape[2], device=x.device)
        return torch.cat([x, pad], dim=1)
    ```

    ## Fix
    ```python
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1, x.shape[2])
        return torch.cat([x, pad], dim=1)
    ```

    ## Fix safety
    Unsafe: the tensor gets the other value's dtype instead of float32 (the point of the fix,
    but a change of meaning). The fix is `x.new_zeros(...)` where the factory takes its device
    from that same `x`, else `dtype=x.dtype`, and `.to(x.dtype)` for `.float()`. No fix when
    the other value is not a plain name, attribute or subscript chain already bound where the
    float32 tensor is made.

    ## False positives
    A float32 tensor can be intended (an accumulator kept in float32 on purpose): then pass
    `dtype=torch.float32`, which this rule never reports. The rule stays silent where the
    other value is float32 too (another factory, `.float()`, the output of an op autocast runs
    in float32 such as `softmax` or `sum`), where the tensor is cast before it is used
    (`.to(x.dtype)`, `.type_as(x)`), on 0-dim tensors (`torch.full((), v)`,
    `torch.tensor(0.0)`: they do not promote), on factories without a device, on copies
    into a slice (`x[:, 0] = x[:, 0] + noise` casts back to `x`'s dtype), and on sums and
    products outside a module class or autocast region (unless the file makes the other value
    half). It follows plain assignments within a function (not a name that a later assignment
    in a loop around the read may rebind), unpackings, `+=`, lists built with `append`, and the
    arguments a file passes to its own helpers; an index bound to a tuple of slices copies into
    a slice. It does not follow values passed between files: a module's output counts as an
    activation although some modules return float32 (a loss's model, in a project that
    enables autocast, although some end in a float32 op). Arguments named like indices or masks
    (`input_ids`, `mask`, `lengths`, …), annotated with a type other than a tensor or with a
    number as default are not taken for activations.
    """

    code = "AMP003"
    preview_paths = ("a float32 tensor meeting a value that is half only under autocast or in a half model (an op's, a module's or an argument's), outside any autocast region of the file, runs")
    name = "tensor-factory-drops-dtype"
    summary = "A float32 tensor (factory without dtype) meets half activations"
    fixable = True
    uses_policy = True
    # A factory call without `dtype=` given a device or moved to one (`.to(` that may only move
    # it), or a `.float()` where an op that needs equal dtypes (an index-put, a scatter) or a
    # half module may take it. Each group starts with what most files lack.
    preview_fragments = (("device", r"device\s*=", AnyOf(*PLACED_WITHOUT_DTYPE)),
                         (r"\.\s*(?:to|cuda)\s*\(", r"\)[\s)]*\.\s*(?:to|cuda)\s*\(", AnyOf(*MOVED_WITHOUT_DTYPE)),
                         (r"\.float\(\)",
                          AnyOf(rf"\.(?:{'|'.join(STRICT_METHODS)})\s*\(", r"\][\s)\\]*=(?!=)", "half", "float16")))
    # Outside preview, the half value needs a producer (`.half()`, `float16`) or a region here.
    fragments = tuple((*group, AnyOf(r"\.half\b", "float16", "autocast")) for group in preview_fragments)

    valid = (
        # An `nn.Softmax` built and called in one expression runs softmax (float32 under
        # autocast): scattered into a float32 buffer, the dtypes agree.
        Valid("""
import torch
from torch import nn
class RepeatDecoder(nn.Module):
    def forward(self, memory, item_seq, num_items):
        scores = nn.Softmax(dim=-1)(self.proj(memory).squeeze(2))
        out = torch.zeros([item_seq.shape[0], num_items], device=memory.device)
        out.scatter_add_(1, item_seq, scores)
        return out
"""),
        # Float32 on purpose: an explicit dtype, and float32 met with float32 (a scatter of
        # float32 ones, a product with what autocast runs in float32: softmax, mean).
        Valid("""
import torch
import torch.nn.functional as F
class Gate(torch.nn.Module):
    def forward(self, hidden, idx):
        acc = torch.zeros(hidden.shape[0], device=hidden.device, dtype=torch.float32)
        scores = F.linear(hidden, self.weight).softmax(dim=-1)
        counts = torch.zeros(hidden.shape[0], 8, device=hidden.device)
        counts.scatter_add_(1, idx, torch.ones(idx.shape, device=hidden.device))
        return acc + hidden.sum(-1), (counts * scores.mean(dim=1)).sum()
"""),
        # 0-dim tensors do not promote; a cast before use; a copy into a slice casts back.
        Valid("""
import torch
class Sine(torch.nn.Module):
    def forward(self, f0):
        total = torch.tensor(0.0, device=f0.device)
        eps = torch.full((), 1e-6, device=f0.device)
        pos = torch.zeros(f0.shape[1], device=f0.device).to(f0.dtype)
        table = torch.ones(f0.shape[1], device=f0.device).type_as(f0)
        rad = f0 / 16000 + pos + table
        noise = torch.rand(f0.shape[0], f0.shape[2], device=f0.device)
        rad[:, 0, :] = rad[:, 0, :] + noise
        return total + rad + eps
"""),
        # Float32 into float32: logits upcast first; a helper only ever called with float32.
        Valid("""
import torch
def listwise(logits, row_idx, col_idx, device):
    logits = logits.float()
    matrix = torch.full((4, 8), -1e16, device=device)
    matrix[row_idx, col_idx] = logits
    return matrix
def totals(segment, flags):
    def seg_sum(vals):
        return torch.zeros(4, device=vals.device).index_add_(0, segment, vals)
    return seg_sum(flags.float()), seg_sum(torch.ones_like(flags, dtype=torch.float32))
"""),
        # A copy into a slice (an int index) casts; no device: a CPU table built from data.
        Valid("""
import torch
class Pos(torch.nn.Module):
    def forward(self, x, nodes):
        table = torch.zeros(len(nodes), 4)
        for i, node in enumerate(nodes):
            table[i] = node.encoding
        out = torch.zeros(x.shape, device=x.device)
        out[0] = x[0]
        return out, table
"""),
        # A loss calling its model on tokens (not tensors it was given), in a project that
        # never enables autocast: nothing says the model's scores are half.
        Valid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", project=(("trainer.py", """
import torch
def train_step(loss_fn, optimizer, batch):
    loss = loss_fn(*batch)
    loss.backward()
    optimizer.step()
"""),)),
        # ... and in a project that does, scores upcast before an activation function: the
        # activation gets float32 and gives float32.
        Valid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        logits = torch.cat([self.model(self.model.tokenize(p))["scores"] for p in pairs]).float()
        logits = self.activation_fn(logits)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", project=(("trainer.py", """
import torch
def train_step(loss_fn, batch):
    with torch.autocast("cuda"):
        return loss_fn(*batch)
"""),)),
    )
    invalid = (
        # The same loss in a project whose trainer (another file) runs it under float16
        # autocast: the model's scores are half there, and the index-put fails.
        Invalid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", fixed="""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, pairs: list[tuple[str, str]], batch_size, max_docs, row_idx, col_idx):
        tokens = self.model.tokenize(pairs)
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), -1e4, device=self.model.device, dtype=logits.dtype)
        matrix[row_idx, col_idx] = logits
        return matrix.log_softmax(dim=1)
""", at=((8, 18, "index-puts `logits` into it, which is float16/bfloat16 when `ListwiseLoss.forward` runs "
                   "under the autocast this project enables (trainer.py:4)"),),
            project=(("trainer.py", """
import torch
def train_step(loss_fn, scaler, optimizer, batch):
    with torch.autocast("cuda"):
        loss = loss_fn(*batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""),)),
        # A list of activations built with `append` and concatenated is the activations.
        Invalid("""
import torch
from torch import nn
class LayerConcat(nn.Module):
    def forward(self, hidden):
        parts = []
        for layer in self.layers:
            hidden = layer(hidden)
            parts.append(hidden)
        stacked = torch.cat(parts, dim=-1)
        pad = torch.zeros(stacked.shape[0], 1, device=stacked.device)
        return torch.cat([stacked, pad], dim=-1)
""", fixed="""
import torch
from torch import nn
class LayerConcat(nn.Module):
    def forward(self, hidden):
        parts = []
        for layer in self.layers:
            hidden = layer(hidden)
            parts.append(hidden)
        stacked = torch.cat(parts, dim=-1)
        pad = stacked.new_zeros(stacked.shape[0], 1)
        return torch.cat([stacked, pad], dim=-1)
""", at=((11, 15, "line 12 concatenates it with `stacked`"),)),
        # A module's output reshaped (`.view(-1)`) is still the activations.
        Invalid("""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, tokens, batch_size, max_docs, docs_per_query):
        logits = self.model(tokens)["scores"].view(-1)
        matrix = torch.full((batch_size, max_docs), 1e-16, device=logits.device)
        rows = torch.repeat_interleave(torch.arange(batch_size), torch.tensor(docs_per_query))
        matrix[rows, 0] = logits
        return matrix
""", fixed="""
import torch
from torch import nn
class ListwiseLoss(nn.Module):
    def forward(self, tokens, batch_size, max_docs, docs_per_query):
        logits = self.model(tokens)["scores"].view(-1)
        matrix = logits.new_full((batch_size, max_docs), 1e-16)
        rows = torch.repeat_interleave(torch.arange(batch_size), torch.tensor(docs_per_query))
        matrix[rows, 0] = logits
        return matrix
""", at=((7, 18, "`torch.full` without `dtype=` makes a float32 tensor, and line 9 index-puts `logits`"),)),
        Invalid("""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = torch.zeros(x.shape[0], 1, x.shape[2], device=x.device)
        return torch.cat([x, pad], dim=1)
""", fixed="""
import torch
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 1, x.shape[2])
        return torch.cat([x, pad], dim=1)
""", at=((6, 15, "`torch.zeros` without `dtype=` makes a float32 tensor, and line 7 concatenates it with `x`"),)),
        # An index-put of half scores, with the device from a variable.
        Invalid("""
import torch
def remap(scores, indices, n, device):
    scores = scores.half()
    full = torch.zeros(scores.shape[0], n, device=device)
    full[:, indices] = scores
    return full
""", fixed="""
import torch
def remap(scores, indices, n, device):
    scores = scores.half()
    full = torch.zeros(scores.shape[0], n, device=device, dtype=scores.dtype)
    full[:, indices] = scores
    return full
""", at=((5, 12, "and line 6 index-puts `scores` into it"),)),
        # A mask made float32, scattered into a tensor that follows the hidden states.
        Invalid("""
import torch
def mean_pool(hidden, word_ids):
    mask = word_ids >= 0
    counts = torch.zeros_like(hidden[:, :, 0])
    counts.scatter_add_(1, word_ids.clamp(min=0), mask.float())
    return counts
""", fixed="""
import torch
def mean_pool(hidden, word_ids):
    mask = word_ids >= 0
    counts = torch.zeros_like(hidden[:, :, 0])
    counts.scatter_add_(1, word_ids.clamp(min=0), mask.to(counts.dtype))
    return counts
""", at=((6, 51, "`mask.float()` makes a float32 tensor, and line 6 `scatter_add_`s it into `counts`"),)),
        # Moved to the device after creation; a boolean-mask index-put of a head's output.
        Invalid("""
import torch
from torch import nn
class MultiHead(nn.Module):
    def forward(self, x, task_labels):
        out = torch.zeros(x.shape[0], self.max_classes).to(x.device)
        for task in task_labels.unique():
            task_mask = task_labels == task
            out[task_mask] = self.heads[str(task.item())](x[task_mask])
        return out
""", at=((6, 15, "and line 9 index-puts `self.heads[str(task.item())](x[task_mask])` into it"),)),
        # Moved by a name bound to a device; the activations reshaped by a method of theirs.
        Invalid("""
import torch
from torch import nn
class Head(nn.Module):
    def forward(self, x):
        dev = x.device
        bias = torch.ones(x.shape[0], 1).to(dev)
        return torch.cat([x.flatten(1), bias], dim=1)
""", at=((7, 16, "line 8 concatenates it with `x.flatten(1)`"),)),
        # Outside a model, with what the file made half (and reshaped).
        Invalid("""
import torch
def pad_tokens(hidden):
    tokens = hidden.half().transpose(0, 1)
    pad = torch.zeros(tokens.shape[0], 1, device=tokens.device)
    return torch.cat([tokens, pad], dim=1)
""", fixed="""
import torch
def pad_tokens(hidden):
    tokens = hidden.half().transpose(0, 1)
    pad = tokens.new_zeros(tokens.shape[0], 1)
    return torch.cat([tokens, pad], dim=1)
""", at=((5, 11, "`torch.zeros` without `dtype=` makes a float32 tensor, and line 6 concatenates it with `tokens`"),)),
        # An RNN's initial state: a half model's LSTM needs it in its input's dtype.
        Invalid("""
import torch
from torch import nn
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(32, 64, batch_first=True)
    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), 64, device=x.device)
        c0 = torch.zeros(1, x.size(0), 64, device=x.device)
        return self.rnn(x, (h0, c0))
""", fixed="""
import torch
from torch import nn
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(32, 64, batch_first=True)
    def forward(self, x):
        h0 = x.new_zeros(1, x.size(0), 64)
        c0 = x.new_zeros(1, x.size(0), 64)
        return self.rnn(x, (h0, c0))
""", at=((9, 14, "line 11 passes it to `self.rnn` as the state of `x`"), (10, 14, "line 11 passes it to `self.rnn`"))),
        # A matmul with a submodule's weight: autocast would cast both, a half model fails.
        Invalid("""
import torch
class Quantizer(torch.nn.Module):
    def forward(self, inputs, distances):
        indices = torch.argmin(distances, dim=1).unsqueeze(1)
        onehot = torch.zeros(len(indices), self.size, device=inputs.device)
        onehot.scatter_(1, indices, 1)
        return torch.matmul(onehot, self.embedding.weight)
""", fixed="""
import torch
class Quantizer(torch.nn.Module):
    def forward(self, inputs, distances):
        indices = torch.argmin(distances, dim=1).unsqueeze(1)
        onehot = torch.zeros(len(indices), self.size, device=inputs.device, dtype=self.embedding.weight.dtype)
        onehot.scatter_(1, indices, 1)
        return torch.matmul(onehot, self.embedding.weight)
""", at=((6, 18, "line 8 multiplies it with `self.embedding.weight` (`matmul`)"),)),
        # Passed to a module the file made half.
        Invalid("""
import torch
model = Net().cuda()
model.half()
def predict(batch):
    mask = batch["mask"] > 0
    return model(torch.ones(mask.shape, device="cuda"), mask.float())
""", at=((7, 18, "passes it to `model`, made half on line 4"), (7, 57, "`mask.float()` makes a float32 tensor, and line 7 passes it"))),
        # What a `lower_precision_fp` op makes in an autocast region is half.
        Invalid("""
import torch
import torch.nn.functional as F
def step(x, w):
    with torch.autocast("cuda"):
        h = F.linear(x, w)
        bias = torch.full((h.shape[0], 1), 0.5, device=h.device)
        return torch.cat([h, bias], dim=1)
""", fixed="""
import torch
import torch.nn.functional as F
def step(x, w):
    with torch.autocast("cuda"):
        h = F.linear(x, w)
        bias = h.new_full((h.shape[0], 1), 0.5)
        return torch.cat([h, bias], dim=1)
""", at=((7, 16, "`torch.full` without `dtype=` makes a float32 tensor, and line 8 concatenates it with `h`"),)),
        # Added to and multiplied with the activations; `.triu` keeps the factory the cause.
        Invalid("""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = torch.full((n, n), -math.inf, device=scores.device).triu(1)
        keep = torch.ones(n, n, device=scores.device)
        return scores + causal, scores * keep
""", fixed="""
import math
import torch
class Attention(torch.nn.Module):
    def forward(self, scores):
        n = scores.size(-1)
        causal = scores.new_full((n, n), -math.inf).triu(1)
        keep = scores.new_ones(n, n)
        return scores + causal, scores * keep
""", at=((7, 18, "line 9 adds it to `scores`"), (8, 16, "line 9 multiplies it with `scores`"))),
    )

    def check(self, ctx: AstContext) -> None:
        # Values meet only in a function that makes one of them (a name is its function's); a
        # `.float()` is reported only where dtypes must agree: an index-put or a scatter in its
        # function, or a call of a module the file made half.
        outline = ctx.outline
        casts = None if modules_made_half(ctx) else {outline.scopes[id(n)] for n in (
            *(a for a in outline.nodes(ast.Assign) if any(isinstance(t, ast.Subscript) for t in a.targets)),
            *(c for c in outline.nodes(ast.Call) if getattr(c.func, "attr", None) in STRICT_METHODS))}
        within = {outline.scopes[id(c)] for c in float32_makers(ctx, casts)
                  if _float_cast(c) or placed_on_device(ctx, c)}
        flow = Activations(ctx)
        reported: set[int] = set()
        for m in _meetings(flow, within) if within else ():
            if id(m.origin) in reported:
                continue
            cast = _float_cast(m.origin)
            if not cast and not placed_on_device(ctx, m.origin):
                continue
            reported.add(id(m.origin))
            made = f"`{ctx.code(m.origin)}`" if cast else f"`{factory(ctx, m.origin)}` without `dtype=`"
            region = reaching_region(ctx, m.node) if m.guessed else None
            evidence, related = "", m.related
            if region is not None and region[2] is not None:  # the region is around a caller
                switch = region_switch(ctx, region[0]) if region[0] is not None else None
                when = f" {switch.when}" if switch else ""
                evidence = f" (this runs under the autocast of line {region[1].lineno}{when}, through the call on " \
                           f"line {region[2].lineno})"
                related += (Related(ctx.path, region[2].lineno, "runs it under autocast"),) \
                    + (switch.related if switch else ())
            # The fix gives it the other value's dtype, where that value means the same there.
            fix = same_dtype_fix(ctx, m.origin, m.other, "unsafe") \
                if m.other is not None and bound_before(ctx, m.other, m.origin) else None
            ctx.report(m.origin, f"{made} makes a float32 tensor, and line {m.node.lineno} {m.text}{evidence}",
                       fix, related=related, preview=m.guessed and region is None)
