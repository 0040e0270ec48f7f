"""Load another version of one of pyfuser's hand-written kernel modules beside the shipped one, for A/B timing.

A variant is the module's source as it is in the repository (relative imports, ``attach`` calls), e.g. an earlier
revision saved with ``git show REV:pyfuser/kernels/nvfp4_layout.py > FILE.py`` (the GPU machine has no git: save it
here and send the file with the run). ``load(path)`` imports it as a module of its own: its relative imports
resolve against ``pyfuser.kernels``, and its ``attach`` calls, which would attach a second kernel to the shipped
ops, do nothing. Nothing of the variant is registered with pyfuser.
"""

from __future__ import annotations

import importlib.util
import sys
from unittest import mock

import pyfuser.kernels
import pyfuser.ops.registry


def load(path: str, name: str = ""):
    """The kernel module at ``path`` (see the module docstring), registered in ``sys.modules`` under ``name``
    (default: one derived from the path; dataclasses look their module up there)."""
    name = name or f"pyfuser.kernels._variant_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = pyfuser.kernels.__name__  # relative imports as the shipped module's
    sys.modules[name] = module
    with mock.patch.object(pyfuser.ops.registry, "attach", lambda *args, **kwargs: None):
        spec.loader.exec_module(module)
    return module
