"""Triton code generation for kernel segments. Importing this package attaches every op's Triton lowering to the
op registry (``OpDef.lower``), by op name."""

from . import elementwise_lowerings  # noqa: F401
from . import reduction_lowerings  # noqa: F401
from . import view_lowerings  # noqa: F401
