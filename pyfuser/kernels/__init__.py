"""Hand-written Triton kernels, one family per file. Importing this package attaches each kernel to the op it
implements (``OpDef.kernel``), by op name; the ops themselves (semantics, checks, pure-torch references) live in
pyfuser/ops."""

from . import group_offsets_check  # noqa: F401
from . import nvfp4_grouped_gemm  # noqa: F401
from . import nvfp4_layout  # noqa: F401
