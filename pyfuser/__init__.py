"""pyfuser: a fusion compiler for PyTorch programs with nvFuser's direct Python frontend.

``import pyfuser as nvfuser_direct`` runs code written for nvFuser's direct bindings.
"""

from . import ops as _ops  # noqa: F401  (registers every op)
from . import codegen as _codegen  # noqa: F401  (attaches Triton lowerings to the ops)
from .errors import (  # noqa: F401
    FusionDefinitionError,
    FusionDtypeError,
    FusionExecutionError,
    InputDeviceError,
    InputTypeError,
    InputValidationError,
    OptionError,
    PyfuserError,
    UnsupportedOpError,
)
from .frontend import FusionDefinition, compute_tensor_descriptor  # noqa: F401
from .frontend import pytorch_utils  # noqa: F401
from .ir import DataType  # noqa: F401
from .runtime.lru_cache import LRUCache  # noqa: F401

__version__ = "0.1.0"
