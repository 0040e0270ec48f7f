"""pyfuser: a fusion compiler for PyTorch programs with nvFuser's direct Python frontend.

``import pyfuser as nvfuser_direct`` runs code written for nvFuser's direct bindings.
"""

from . import ops as _ops  # noqa: F401  (registers every op)
from . import codegen as _codegen  # noqa: F401  (attaches Triton lowerings to the ops)
from . import kernels as _kernels  # noqa: F401  (attaches hand-written Triton kernels to the ops)
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
from .frontend import nvf_cutlass  # noqa: F401  (nvFuser's nvfuser_direct.nvf_cutlass functions)
from .frontend.defined_fusion import DefinedFusion as Fusion  # noqa: F401
from .frontend.fusion_cache import LRUCache, LruFusionCache  # noqa: F401
from .frontend.profiler import PythonProfiler  # noqa: F401
from .frontend.version import version  # noqa: F401
from .ir import DataType  # noqa: F401
from .ir.nodes import Scalar, TensorView, Vector  # noqa: F401

from .multidevice import ParallelType, execute_with_dtensors, multidevice  # noqa: F401,E402
from .nvfuser_names import register_as_nvfuser_direct  # noqa: F401,E402

# pyfuser's own release; version() is the nvFuser API level it implements.
__version__ = "0.1.0"
