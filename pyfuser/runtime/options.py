"""Per-call options (nvFuser's NVFUSER_ENABLE / NVFUSER_DISABLE, as execute's _enable/_disable_options)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from ..errors import OptionError

# name -> what it does. Disable options are on by default.
DISABLE_OPTIONS = {
    "infer_contiguity": "meta-device inference of ExprEval segment output layouts (off: assume contiguous)",
    "kernel_codegen": "generated Triton kernels for kernel segments (off: every segment runs on ATen)",
}
ENABLE_OPTIONS = {
    "check_layouts": "after each segment, check the real outputs against the inferred layouts (debugging aid)",
}


@dataclass(frozen=True)
class Options:
    infer_contiguity: bool = True
    kernel_codegen: bool = True
    check_layouts: bool = False


def _env_names(var: str) -> tuple[str, ...]:
    raw = os.environ.get(var, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())


@lru_cache(maxsize=256)
def _parse(enable: tuple, disable: tuple) -> Options:
    for name in enable:
        if name not in ENABLE_OPTIONS:
            raise OptionError(f"unknown enable option {name!r}; known: {sorted(ENABLE_OPTIONS)}")
    for name in disable:
        if name not in DISABLE_OPTIONS:
            raise OptionError(f"unknown disable option {name!r}; known: {sorted(DISABLE_OPTIONS)}")
    return Options(
        infer_contiguity="infer_contiguity" not in disable,
        kernel_codegen="kernel_codegen" not in disable,
        check_layouts="check_layouts" in enable,
    )


def parse_options(enable: Sequence[str] = (), disable: Sequence[str] = ()) -> Options:
    """Options for one call: the arguments plus PYFUSER_/NVFUSER_ENABLE and _DISABLE from the environment."""
    if isinstance(enable, str) or isinstance(disable, str):
        raise OptionError("_enable_options/_disable_options take a list of option names, not a string")
    env_enable = _env_names("PYFUSER_ENABLE") + _env_names("NVFUSER_ENABLE")
    env_disable = _env_names("PYFUSER_DISABLE") + _env_names("NVFUSER_DISABLE")
    return _parse(tuple(enable) + env_enable, tuple(disable) + env_disable)
