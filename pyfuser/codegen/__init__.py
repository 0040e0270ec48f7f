"""Triton code generation for kernel segments. Importing this package attaches every op's Triton lowering to the
op registry (``OpDef.lower``), by op name, and, when kernels run under Triton's CPU interpreter
(``TRITON_INTERPRET=1``), patches the interpreter to compute what a GPU computes (``interpreter_compat``)."""

from . import interpreter_compat
from . import elementwise_lowerings  # noqa: F401
from . import gather_lowerings  # noqa: F401
from . import reduction_lowerings  # noqa: F401
from . import resize_lowerings  # noqa: F401
from . import scatter_lowerings  # noqa: F401
from . import sort_lowerings  # noqa: F401
from . import view_lowerings  # noqa: F401

interpreter_compat.install()
