"""pyfuser's IR: dtypes, values, expressions and the Fusion container."""

from .dtypes import DataType, from_torch_dtype, to_torch_dtype  # noqa: F401
from .fusion import Fusion, FusionGuard, current_fusion  # noqa: F401
from .nodes import Expr, IterDomain, IterType, Scalar, TensorView, Val, Vector  # noqa: F401
