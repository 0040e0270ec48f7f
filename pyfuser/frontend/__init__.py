"""The nvFuser-compatible Python frontend."""

from . import val_methods  # noqa: F401  (nvFuser's Val methods)
from .fusion_definition import FusionDefinition  # noqa: F401
from .tensor_descriptor import compute_tensor_descriptor  # noqa: F401
