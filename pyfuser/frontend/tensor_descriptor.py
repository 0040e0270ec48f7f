"""nvFuser's ``compute_tensor_descriptor`` and stride_order helpers, as the frontend exposes them (the
implementation is IR-level: pyfuser/ir/tensor_layout.py)."""

from ..ir.tensor_layout import (  # noqa: F401
    alloc_order_from_stride_order,
    allocation_order_from_strides,
    compute_tensor_descriptor,
)
