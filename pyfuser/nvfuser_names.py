"""``register_as_nvfuser_direct()``: make ``import nvfuser_direct`` return pyfuser.

Code written for nvFuser (and clients that import it by name, like Lightning Thunder) then runs on pyfuser
unchanged. nvFuser's submodules are registered too (``nvfuser_direct.pytorch_utils``,
``nvfuser_direct.nvf_cutlass``, ``nvfuser_direct.nvfuser_direct_version``). Thunder 0.2.6 also imports
``compute_tensor_descriptor`` from the legacy module name ``nvfuser``; that name is registered as well unless a
real ``nvfuser`` is installed (or ``legacy_name=False``).
"""

from __future__ import annotations

import importlib.util
import sys
import types


def _version_module():
    from .frontend import version as v

    mod = types.ModuleType("nvfuser_direct.nvfuser_direct_version")
    mod.Version = v.Version
    mod.NvfuserVersion = v.NvfuserVersion
    mod.__version__ = v.__version__
    return mod


def register_as_nvfuser_direct(legacy_name: bool = True):
    """Register pyfuser under nvFuser's module names; returns the pyfuser module. Idempotent."""
    import pyfuser

    previous = sys.modules.get("nvfuser_direct")
    # nvFuser's own package carries its compiled bindings as _C_DIRECT; anything else under the name (a shim
    # module that calls this function while it is being imported) is replaced.
    if previous is not None and previous is not pyfuser and hasattr(previous, "_C_DIRECT"):
        raise ImportError("register_as_nvfuser_direct: a real nvfuser_direct is already imported in this process")
    sys.modules["nvfuser_direct"] = pyfuser
    sys.modules["nvfuser_direct.pytorch_utils"] = pyfuser.pytorch_utils
    sys.modules["nvfuser_direct.nvf_cutlass"] = pyfuser.nvf_cutlass
    sys.modules["nvfuser_direct.nvfuser_direct_version"] = _version_module()
    pyfuser.nvfuser_direct_version = sys.modules["nvfuser_direct.nvfuser_direct_version"]
    if legacy_name and "nvfuser" not in sys.modules:
        try:
            real = importlib.util.find_spec("nvfuser") is not None
        except (ImportError, ValueError):
            real = False
        if not real:
            sys.modules["nvfuser"] = pyfuser
    return pyfuser
