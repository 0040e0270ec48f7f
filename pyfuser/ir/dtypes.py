"""nvFuser's DataType enum, its torch equivalents and the promotion rules the frontend follows."""

from __future__ import annotations

import enum

import torch


class DataType(enum.Enum):
    Double = "Double"
    Float = "Float"
    Half = "Half"
    Int = "Int"
    Int32 = "Int32"
    UInt64 = "UInt64"
    Index = "Index"
    Bool = "Bool"
    BFloat16 = "BFloat16"
    Float8_e4m3fn = "Float8_e4m3fn"
    Float8_e5m2 = "Float8_e5m2"
    Float8_e8m0fnu = "Float8_e8m0fnu"
    Float4_e2m1fn = "Float4_e2m1fn"
    Float4_e2m1fn_x2 = "Float4_e2m1fn_x2"
    ComplexFloat = "ComplexFloat"
    ComplexDouble = "ComplexDouble"
    Null = "Null"

    def __repr__(self) -> str:
        return f"DataType.{self.name}"

    __str__ = __repr__


def _optional_torch_dtype(name: str):
    # fp8/fp4 dtypes exist in every torch we support, but stay defensive for older builds.
    return getattr(torch, name, None)


# Index is int64 at the Python level (kernels may narrow it to int32 later).
# Float4_e2m1fn has no unpacked torch dtype: at run time it lives in torch.float4_e2m1fn_x2 storage
# whose innermost allocation dim is half the logical extent (frontend.md "Packed FP4").
_TO_TORCH = {
    DataType.Double: torch.float64,
    DataType.Float: torch.float32,
    DataType.Half: torch.float16,
    DataType.Int: torch.int64,
    DataType.Int32: torch.int32,
    DataType.UInt64: torch.uint64,
    DataType.Index: torch.int64,
    DataType.Bool: torch.bool,
    DataType.BFloat16: torch.bfloat16,
    DataType.Float8_e4m3fn: _optional_torch_dtype("float8_e4m3fn"),
    DataType.Float8_e5m2: _optional_torch_dtype("float8_e5m2"),
    DataType.Float8_e8m0fnu: _optional_torch_dtype("float8_e8m0fnu"),
    DataType.Float4_e2m1fn: _optional_torch_dtype("float4_e2m1fn_x2"),
    DataType.Float4_e2m1fn_x2: _optional_torch_dtype("float4_e2m1fn_x2"),
    DataType.ComplexFloat: torch.complex64,
    DataType.ComplexDouble: torch.complex128,
}

# Reverse map. torch.int64 maps to Int (not Index) and float4_e2m1fn_x2 to the packed type.
_FROM_TORCH = {}
for _dt, _tdt in _TO_TORCH.items():
    if _tdt is not None and _dt not in (DataType.Index, DataType.Float4_e2m1fn):
        _FROM_TORCH.setdefault(_tdt, _dt)


def to_torch_dtype(dtype: DataType) -> torch.dtype:
    tdt = _TO_TORCH.get(dtype)
    if tdt is None:
        raise TypeError(f"{dtype!r} has no torch dtype")
    return tdt


def from_torch_dtype(tdt: torch.dtype) -> DataType:
    try:
        return _FROM_TORCH[tdt]
    except KeyError:
        raise TypeError(f"torch dtype {tdt} has no pyfuser DataType") from None


# nvFuser's C++ names of the dtypes, as its printed math and its error messages show them.
C_TYPE_NAMES = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "__half", DataType.BFloat16: "__bfloat",
    DataType.Int: "int64_t", DataType.Int32: "int", DataType.UInt64: "uint64_t", DataType.Index: "nvfuser_index_t",
    DataType.Bool: "bool", DataType.Float8_e4m3fn: "__e4m3", DataType.Float8_e5m2: "__e5m2",
    DataType.Float8_e8m0fnu: "__e8m0", DataType.Float4_e2m1fn: "__e2m1", DataType.Float4_e2m1fn_x2: "__e2m1x2",
    DataType.ComplexFloat: "std::complex<float>", DataType.ComplexDouble: "std::complex<double>",
}


def c_type_name(dt: DataType) -> str:
    return C_TYPE_NAMES.get(dt, dt.name.lower())


FLOATING = frozenset(
    {
        DataType.Double,
        DataType.Float,
        DataType.Half,
        DataType.BFloat16,
        DataType.Float8_e4m3fn,
        DataType.Float8_e5m2,
        DataType.Float8_e8m0fnu,
        DataType.Float4_e2m1fn,
        DataType.Float4_e2m1fn_x2,
    }
)
INTEGRAL = frozenset({DataType.Int, DataType.Int32, DataType.UInt64, DataType.Index})
COMPLEX = frozenset({DataType.ComplexFloat, DataType.ComplexDouble})
# Types that computation never happens in: arithmetic on them is done (and returned) in Float.
REDUCED_FLOAT = FLOATING - {DataType.Double, DataType.Float}


def is_floating(dt: DataType) -> bool:
    return dt in FLOATING


def is_integral(dt: DataType) -> bool:
    return dt in INTEGRAL


def is_complex(dt: DataType) -> bool:
    return dt in COMPLEX


def is_boolean(dt: DataType) -> bool:
    return dt is DataType.Bool


def compute_dtype(dt: DataType) -> DataType:
    """Reduced-precision floats compute (and, for arithmetic ops, return) in Float."""
    return DataType.Float if dt in REDUCED_FLOAT else dt


# A representative Python value per scalar category, used to ask torch for its promotion result.
def _scalar_sample(dt: DataType):
    if dt is DataType.Bool:
        return False
    if dt in INTEGRAL:
        return 0
    if dt in COMPLEX:
        return 0j
    return 0.0


def _promotion_dtype(dt: DataType) -> torch.dtype:
    # fp4 has no arithmetic in torch; it promotes like the other narrow floats.
    if dt in (DataType.Float4_e2m1fn, DataType.Float4_e2m1fn_x2, DataType.Float8_e8m0fnu):
        return torch.bfloat16
    return to_torch_dtype(dt)


def promote(*operands: tuple[DataType, bool]) -> DataType:
    """PyTorch type promotion over (dtype, is_tensor) pairs.

    Tensors dominate scalars of the same category, as in torch: ``bf16_tensor * 2.0`` stays bf16 (and is then
    widened to Float by the arithmetic ops), while ``int_tensor * 2.0`` becomes the default float (Float).
    0-dim tensors behave like scalars in torch; nvFuser treats every TensorView as a tensor, and so do we.
    """
    if not operands:
        raise ValueError("promote() needs at least one operand")
    args = []
    for dt, is_tensor in operands:
        if is_tensor:
            args.append(torch.empty((1,), dtype=_promotion_dtype(dt), device="meta"))
        else:
            args.append(_scalar_sample(dt))
    if len(args) == 1:
        only = operands[0][0]
        return only
    result = args[0]
    for a in args[1:]:
        result = _result_type(result, a)
    tdt = result.dtype if isinstance(result, torch.Tensor) else None
    if tdt is None:
        # All operands were scalars: promote the Python values.
        return _scalar_promote([dt for dt, _ in operands])
    return from_torch_dtype(tdt)


def _result_type(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        tdt = torch.result_type(a, b)
        return torch.empty((1,), dtype=tdt, device="meta")
    return a + b  # Python scalar promotion: bool < int < float < complex


_SCALAR_RANK = {
    DataType.Bool: 0,
    DataType.Int32: 1,
    DataType.Int: 2,
    DataType.Index: 2,
    DataType.UInt64: 2,
    DataType.Float: 4,
    DataType.Double: 5,
    DataType.ComplexFloat: 6,
    DataType.ComplexDouble: 7,
}


def _scalar_promote(dts: list[DataType]) -> DataType:
    """Scalar-only arithmetic: the widest category wins, and within a category the widest type."""
    best = max(dts, key=lambda d: _SCALAR_RANK.get(d, 3))
    return DataType.Float if best in REDUCED_FLOAT else best
