"""Arguments for an op, built from its schema, in the input configurations the classifier needs.

Each configuration decides which floating-point tensors are float32 and which are the
lower-precision dtype: ``fp32`` (all float32), ``lowp`` (all lower precision), ``mixed``
(the first float32, the rest lower precision) and ``lowp_dtype`` (all lower precision and
an explicit ``dtype=`` argument of the lower-precision dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# Tensor arguments that hold integers (indices, class targets), by name.
_INTEGER_TENSORS = {"index", "indices", "offsets"}
_INTEGER_TARGET_OPS = ("nll_loss", "cross_entropy", "multi_margin", "multilabel_margin")

# Shapes to try, in order, when an op's own checks reject the previous one (execute mode).
SHAPES = ((4, 4), (2, 4, 4), (2, 4, 4, 4), (4,), (2, 4, 4, 4, 4))

MakeTensor = Callable[[str, torch.dtype, tuple[int, ...], bool], torch.Tensor]


@dataclass
class Sample:
    config: str
    args: list[Any]
    kwargs: dict[str, Any]
    float_inputs: int


def _is_integer_tensor(op_base: str, arg_name: str) -> bool:
    if arg_name in _INTEGER_TENSORS:
        return True
    return arg_name == "target" and any(k in op_base for k in _INTEGER_TARGET_OPS)


def _scalar_default(arg, shape: tuple[int, ...]) -> Any:
    real = str(arg.real_type)
    if arg.has_default_value():
        return arg.default_value
    if real.startswith("Optional["):
        return None
    if real in ("int", "SymInt"):
        return 1 if len(shape) > 1 else 0
    if real in ("List[int]", "List[SymInt]"):
        return [shape[-1]] if arg.name == "normalized_shape" else [1]
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
    """The input configurations for one op and one shape; raises ValueError if one can't be built."""
    plan: list[tuple[str, str, Any]] = []  # (kind, name, value-or-None)
    float_slots = 0
    for arg in schema.arguments:
        if arg.is_out:
            raise ValueError("out= overload")
        real = str(arg.real_type)
        if real == "Tensor" or (real == "Optional[Tensor]" and optional_tensors):
            kind = "int_tensor" if _is_integer_tensor(op_base, arg.name) else "float_tensor"
            float_slots += kind == "float_tensor"
            plan.append((kind, arg.name, None))
        elif real == "List[Tensor]":
            plan.append(("float_list", arg.name, None))
            float_slots += 2
        elif real == "List[Optional[Tensor]]":
            plan.append(("int_list", arg.name, None))
        elif real == "Optional[Tensor]":
            plan.append(("value", arg.name, None))
        else:
            plan.append(("value", arg.name, _scalar_default(arg, shape)))

    has_dtype = any(a.name == "dtype" and str(a.real_type) == "Optional[ScalarType]"
                    for a in schema.arguments)
    kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}

    def materialise(dtypes: list[torch.dtype], dtype_arg: torch.dtype | None) -> tuple[list, dict]:
        it = iter(dtypes)
        args, kwargs = [], {}
        for kind, name, value in plan:
            if kind == "float_tensor":
                v = make(name, next(it), shape, False)
            elif kind == "int_tensor":
                v = make(name, torch.long, shape, True)
            elif kind == "float_list":
                v = [make(f"{name}[{i}]", next(it), shape, False) for i in range(2)]
            elif kind == "int_list":
                v = [make(f"{name}[0]", torch.long, shape, True)]
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
