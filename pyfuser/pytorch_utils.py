"""``nvfuser_direct.pytorch_utils`` under pyfuser's name: ``from pyfuser.pytorch_utils import ...`` works."""

from .frontend.pytorch_utils import nvfuser_dtype_to_torch_dtype, torch_dtype_to_nvfuser_dtype  # noqa: F401
