"""torch <-> DataType conversions, under the module name nvFuser uses (``nvfuser_direct.pytorch_utils``)."""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType, from_torch_dtype, to_torch_dtype


def torch_dtype_to_nvfuser_dtype(dtype: torch.dtype) -> DataType:
    """torch.float32 -> DataType.Float, torch.int64 -> DataType.Int, torch.int32 -> DataType.Int32, ..."""
    if isinstance(dtype, DataType):
        return dtype
    return from_torch_dtype(dtype)


def nvfuser_dtype_to_torch_dtype(dtype: DataType) -> torch.dtype:
    return to_torch_dtype(dtype)


__all__ = ["torch_dtype_to_nvfuser_dtype", "nvfuser_dtype_to_torch_dtype"]
