"""Arguments for an op, built from its schema, in the input configurations the classifier needs.

Each configuration decides which floating-point tensors are float32 and which are the
lower-precision dtype: ``fp32`` (all float32), ``lowp`` (all lower precision), ``mixed``
(the first float32, the rest lower precision) and ``lowp_dtype`` (all lower precision and
an explicit ``dtype=`` argument of the lower-precision dtype).

What a schema cannot say (a conv_transpose weight's channels, a positive-definite matrix)
comes from ``SPECIFIC``; tensor values matter only to execute mode, which ``Fill``s them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

# Tensor arguments that hold integers (indices, class targets), by name.
_INTEGER_TENSORS = {"index", "indices", "offsets"}
_INTEGER_TARGET_OPS = {"nll_loss", "nll_loss2d", "nll_loss_nd", "cross_entropy_loss", "multi_margin_loss",
                       "multilabel_margin_loss", "multilabel_margin_loss_forward"}

# Shapes to try, in order, when an op's own checks reject the previous one (execute mode).
SHAPES = ((4, 4), (2, 4, 4), (2, 4, 4, 4), (4,), (2, 4, 4, 4, 4))

# The values of a tensor that execute mode runs an op on: (shape, dtype) -> a CPU tensor.
Fill = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def _positive(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Floats in [0.5, 1.5): no zero to divide by, no negative to take a log or root of."""
    return (torch.rand(shape) + 0.5).to(dtype)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Indices and class targets that every size admits."""
    return torch.zeros(shape, dtype=dtype)


def _probabilities(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(shape) * 0.8 + 0.1).to(dtype)


def _positive_definite(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    a = torch.rand(shape)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1])).to(dtype)


def _full(value: int) -> Fill:
    return lambda shape, dtype: torch.full(shape, value, dtype=dtype)


def _identity_pivots(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """LU pivots (1-based) that swap no rows."""
    return torch.arange(1, shape[-1] + 1, dtype=dtype).expand(shape).contiguous()


MakeTensor = Callable[[str, torch.dtype, tuple[int, ...], Fill], torch.Tensor]


@dataclass(frozen=True)
class Specific:
    """What an op's own checks need that its schema does not say, by argument name: tensor
    shapes, non-tensor values, integer tensors (and their dtype) and tensor values."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    integers: dict[str, torch.dtype] = field(default_factory=dict)
    fills: dict[str, Fill] = field(default_factory=dict)


_CONV_TRANSPOSE = {n: Specific(shapes={"input": (2, 4) + (4,) * n, "weight": (4, 4) + (3,) * n, "bias": (4,)})
                   for n in (1, 2, 3)}
_GRID_2D = Specific(shapes={"input": (2, 4, 4, 4), "grid": (2, 4, 4, 2)})
_LOSS_PER_CLASS = Specific(shapes={"self": (4, 4), "target": (4,), "weight": (4,)})
_PAIR_LOSS = Specific(shapes={"input1": (4, 4), "input2": (4, 4), "target": (4,)})
_QUANTILE = Specific(shapes={"self": (4, 4), "q": (4,)}, fills={"q": _probabilities})
_CHOLESKY = Specific(fills={"self": _positive_definite})
_HOUSEHOLDER = Specific(shapes={"input": (4, 4), "self": (4, 4), "tau": (4,), "input2": (4,),
                                "input3": (4, 4)})
_STFT = Specific(shapes={"self": (2, 16), "window": (4,)}, values={"n_fft": 4, "return_complex": True})
_CTC = Specific(shapes={"log_probs": (4, 2, 4), "targets": (2, 2), "input_lengths": (2,), "target_lengths": (2,)},
                values={"input_lengths": [4, 4], "target_lengths": [2, 2]},
                integers={"targets": torch.long, "input_lengths": torch.long, "target_lengths": torch.long},
                fills={"targets": _full(1), "input_lengths": _full(4), "target_lengths": _full(2)})
_FRACTIONAL_POOL = {n: Specific(shapes={"self": (2, 4) + (4,) * n, "random_samples": (2, 4, n)},
                                values={"kernel_size": [2] * n, "output_size": [2] * n},
                                fills={"random_samples": _probabilities})
                    for n in (2, 3)}

# Ops whose arguments depend on each other in ways a schema cannot say (a conv_transpose
# weight's channels, a grid's last dimension, a positive-definite matrix), by name, or by
# name and overload where the overloads need different arguments.
SPECIFIC: dict[str, Specific] = {
    "conv_transpose1d": _CONV_TRANSPOSE[1],
    "conv_transpose2d": _CONV_TRANSPOSE[2],
    "conv_transpose3d": _CONV_TRANSPOSE[3],
    "conv_tbc": Specific(shapes={"self": (4, 2, 4), "weight": (1, 4, 4), "bias": (4,)}),
    "addbmm": Specific(shapes={"self": (4, 4), "batch1": (2, 4, 4), "batch2": (2, 4, 4)}),
    "prelu": Specific(shapes={"self": (2, 4, 4), "weight": (4,)}),
    "grid_sampler": _GRID_2D,
    "grid_sampler_2d": _GRID_2D,
    "_grid_sampler_2d_cpu_fallback": _GRID_2D,
    "grid_sampler_3d": Specific(shapes={"input": (2, 4, 4, 4, 4), "grid": (2, 4, 4, 4, 3)}),
    "fractional_max_pool2d": _FRACTIONAL_POOL[2],
    "fractional_max_pool3d": _FRACTIONAL_POOL[3],
    "binary_cross_entropy": Specific(fills={"self": _probabilities, "target": _probabilities}),
    "cross_entropy_loss": _LOSS_PER_CLASS,
    "nll_loss": _LOSS_PER_CLASS,
    "multi_margin_loss": _LOSS_PER_CLASS,
    "nll_loss2d": Specific(shapes={"self": (2, 4, 4, 4), "target": (2, 4, 4), "weight": (4,)}),
    "cosine_embedding_loss": _PAIR_LOSS,
    "ctc_loss": _CTC,
    "quantile": _QUANTILE,
    "nanquantile": _QUANTILE,
    "cholesky": _CHOLESKY,
    "linalg_cholesky": _CHOLESKY,
    "linalg_cond.p_str": Specific(values={"p": "fro"}),
    "linalg_householder_product": _HOUSEHOLDER,
    "orgqr": _HOUSEHOLDER,
    "ormqr": _HOUSEHOLDER,
    "linalg_tensorinv": Specific(shapes={"self": (2, 2, 2, 2)}),
    "linalg_tensorsolve": Specific(shapes={"self": (4, 2, 2), "other": (4,)}),
    "lu_solve": Specific(shapes={"self": (4, 2), "LU_data": (4, 4), "LU_pivots": (4,)},
                         integers={"LU_pivots": torch.int32}, fills={"LU_pivots": _identity_pivots}),
    "stft": _STFT,
    "view_as_complex": Specific(shapes={"self": (4, 2)}),
    "_native_multi_head_attention": Specific(
        shapes={"query": (2, 4, 4), "key": (2, 4, 4), "value": (2, 4, 4), "qkv_weight": (12, 4),
                "qkv_bias": (12,), "proj_weight": (4, 4), "proj_bias": (4,), "mask": (4, 4)},
        values={"embed_dim": 4}),
    # A matrix times a vector; a cross product along a dimension of size 3; two dimensions.
    "mv": Specific(shapes={"self": (4, 4), "vec": (4,)}),
    "addmv": Specific(shapes={"self": (4,), "mat": (4, 4), "vec": (4,)}),
    "cross": Specific(shapes={"self": (4, 3), "other": (4, 3)}),
    "nuclear_norm.dim": Specific(shapes={"self": (4, 4)}, values={"dim": [0, 1]}),
    # RNN cells of hidden size 4 (an LSTM's four gates 16 wide, a GRU's three 12 wide).
    "lstm_cell": Specific(shapes={"input": (2, 4), "hx": (2, 4), "w_ih": (16, 4), "w_hh": (16, 4),
                                  "b_ih": (16,), "b_hh": (16,)}),
    "gru_cell": Specific(shapes={"input": (2, 4), "hx": (2, 4), "w_ih": (12, 4), "w_hh": (12, 4),
                                 "b_ih": (12,), "b_hh": (12,)}),
    "_thnn_fused_lstm_cell": Specific(shapes={"input_gates": (2, 16), "hidden_gates": (2, 16), "cx": (2, 4),
                                              "input_bias": (16,), "hidden_bias": (16,)}),
    "_thnn_fused_gru_cell": Specific(shapes={"input_gates": (2, 12), "hidden_gates": (2, 12), "hx": (2, 4),
                                             "input_bias": (12,), "hidden_bias": (12,)}),
    # (batch, heads, length, head size): flash attention wants the head size a multiple of 8.
    "_scaled_dot_product_flash_attention": Specific(shapes={"query": (2, 2, 4, 8), "key": (2, 2, 4, 8),
                                                            "value": (2, 2, 4, 8)}),
    "cudnn_convolution_transpose": Specific(shapes={"self": (2, 4, 4, 4), "weight": (4, 4, 3, 3)},
                                            values={"padding": [0, 0], "output_padding": [0, 0], "stride": [1, 1],
                                                    "dilation": [1, 1], "groups": 1}),
    # One LSTM layer as torch's decomposition calls it (mode 2: ideep's LSTM; hidden size 4).
    "mkldnn_rnn_layer": Specific(
        shapes={"input": (4, 2, 4), "weight0": (16, 4), "weight1": (16, 4), "weight2": (16,),
                "weight3": (16,), "hx_": (1, 2, 4), "cx_": (1, 2, 4)},
        values={"batch_sizes": [], "mode": 2, "hidden_size": 4, "has_biases": True}),
    # cuDNN's RNN as nn.RNN calls it: one tanh layer (mode 1), hidden size 4, no biases, so the
    # weight list is [w_ih, w_hh] and weight_stride0 is 2; no projection.
    "_cudnn_rnn": Specific(
        shapes={"input": (4, 2, 4), "weight": (4, 4), "hx": (1, 2, 4)},
        values={"weight_stride0": 2, "mode": 1, "hidden_size": 4, "proj_size": 0, "num_layers": 1,
                "batch_first": False, "dropout": 0.0, "train": True, "bidirectional": False,
                "batch_sizes": []}),
}


@dataclass
class Sample:
    config: str
    args: list[Any]
    kwargs: dict[str, Any]
    float_inputs: int


def _is_integer_tensor(op_base: str, arg_name: str) -> bool:
    if arg_name in _INTEGER_TENSORS:
        return True
    return arg_name == "target" and op_base in _INTEGER_TARGET_OPS


def _scalar_default(arg, shape: tuple[int, ...]) -> Any:
    real = str(arg.real_type)
    if arg.has_default_value():
        return arg.default_value
    if real.startswith("Optional["):
        return None
    if real in ("int", "SymInt"):
        return 1 if len(shape) > 1 else 0
    if real in ("List[int]", "List[SymInt]"):
        # A fixed length (``SymInt[4] padding``) is in the schema; ones fit every size.
        return [shape[-1]] if arg.name == "normalized_shape" else [1] * (arg.N or 1)
    if real in ("float", "number"):
        return 1.0
    if real == "bool":
        return False
    if real == "str":
        return "ij,jk->ik" if arg.name == "equation" else "mean"
    if real == "ScalarType":
        return torch.float32
    if real == "Dimname":
        return "N"
    if real == "List[Dimname]":
        return ["N"]
    raise ValueError(f"no sample for argument {arg.name}: {real}")


def build(schema, op_base: str, make: MakeTensor, shape: tuple[int, ...],
          lowp: torch.dtype, optional_tensors: bool = True) -> list[Sample]:
    """The input configurations for one op and one shape (where the op's ``SPECIFIC`` entry
    gives none); raises ValueError if one can't be built."""
    specific = SPECIFIC.get(f"{op_base}.{schema.overload_name}") or SPECIFIC.get(op_base, Specific())
    plan: list[tuple[str, str, Any]] = []  # (kind, name, value-or-None)
    float_slots = 0
    for arg in schema.arguments:
        if arg.is_out:
            raise ValueError("out= overload")
        real = str(arg.real_type)
        if real == "Tensor" or (real == "Optional[Tensor]" and optional_tensors):
            integer = arg.name in specific.integers or _is_integer_tensor(op_base, arg.name)
            kind = "int_tensor" if integer else "float_tensor"
            float_slots += kind == "float_tensor"
            plan.append((kind, arg.name, None))
        elif real == "List[Tensor]":
            plan.append(("float_list", arg.name, None))
            float_slots += 2
        elif real == "List[Optional[Tensor]]":
            plan.append(("int_list", arg.name, None))
        elif real == "Optional[Tensor]":
            plan.append(("value", arg.name, None))
        elif arg.name in specific.values:
            plan.append(("value", arg.name, specific.values[arg.name]))
        else:
            plan.append(("value", arg.name, _scalar_default(arg, shape)))

    has_dtype = any(a.name == "dtype" and str(a.real_type) == "Optional[ScalarType]"
                    for a in schema.arguments)
    kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}

    def tensor(name: str, dtype: torch.dtype, label: str | None = None) -> torch.Tensor:
        fill = specific.fills.get(name, _positive if dtype.is_floating_point else _zeros)
        return make(label or name, dtype, specific.shapes.get(name, shape), fill)

    def materialise(dtypes: list[torch.dtype], dtype_arg: torch.dtype | None) -> tuple[list, dict]:
        it = iter(dtypes)
        args, kwargs = [], {}
        for kind, name, value in plan:
            if kind == "float_tensor":
                v = tensor(name, next(it))
            elif kind == "int_tensor":
                v = tensor(name, specific.integers.get(name, torch.long))
            elif kind == "float_list":
                v = [tensor(name, next(it), f"{name}[{i}]") for i in range(2)]
            elif kind == "int_list":
                v = [tensor(name, torch.long, f"{name}[0]")]
            elif name == "dtype" and dtype_arg is not None:
                v = dtype_arg
            else:
                v = value
            if name in kwarg_only:
                kwargs[name] = v
            else:
                args.append(v)
        return args, kwargs

    configs = [("fp32", [torch.float32] * float_slots, None),
               ("lowp", [lowp] * float_slots, None)]
    if float_slots >= 2:
        configs.append(("mixed", [torch.float32] + [lowp] * (float_slots - 1), None))
    if has_dtype and float_slots:
        configs.append(("lowp_dtype", [lowp] * float_slots, lowp))
    samples = []
    for config, dtypes, dtype_arg in configs:
        args, kwargs = materialise(dtypes, dtype_arg)
        samples.append(Sample(config, args, kwargs, float_slots))
    return samples
