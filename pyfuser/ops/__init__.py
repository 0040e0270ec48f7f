"""The op registry and every op's definition. Importing this package registers all ops."""

from . import registry  # noqa: F401
from . import operators  # noqa: F401
from . import elementwise  # noqa: F401
from . import shape  # noqa: F401
from . import matmul  # noqa: F401
from . import reduction  # noqa: F401
from . import indexing  # noqa: F401
from . import factory  # noqa: F401
from . import misc  # noqa: F401
from . import grouped_mm  # noqa: F401
from . import narrow_precision  # noqa: F401
from . import scaled  # noqa: F401
from .registry import OpDef, OpKind, OpResult, all_ops, get, register  # noqa: F401
