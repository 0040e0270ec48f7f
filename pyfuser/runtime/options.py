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
    "offset_checks": "host-side checks of group offsets' values, NVFP4 ops and grouped_mm (one device-to-host copy "
    "per op call; off: the "
    "offsets are trusted, as upstream does; kernels still never write outside their buffers)",
}
ENABLE_OPTIONS = {
    "check_layouts": "after each segment, check the real outputs against the inferred layouts (debugging aid)",
}


@dataclass(frozen=True)
class Options:
    infer_contiguity: bool = True
    kernel_codegen: bool = True
    offset_checks: bool = True
    check_layouts: bool = False


_ENV_VARS = ("PYFUSER_ENABLE", "NVFUSER_ENABLE", "PYFUSER_DISABLE", "NVFUSER_DISABLE")
_ENV_KEYS = tuple(os.fsencode(v) for v in _ENV_VARS)


def _env_snapshot() -> tuple:
    """The four option variables' raw values. This runs on every execute, so it reads CPython's underlying
    byte mapping (about 0.1 µs a variable) rather than os.environ's encoding __getitem__ (about 1 µs)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        return tuple(data.get(k) for k in _ENV_KEYS)
    return tuple(os.environ.get(v) for v in _ENV_VARS)


def _names(raw) -> tuple[str, ...]:
    if raw is None:
        return ()
    text = os.fsdecode(raw) if isinstance(raw, bytes) else raw
    return tuple(n.strip() for n in text.split(",") if n.strip())


@lru_cache(maxsize=256)
def _parse(enable: tuple, disable: tuple, env: tuple) -> Options:
    enable = enable + _names(env[0]) + _names(env[1])
    disable = disable + _names(env[2]) + _names(env[3])
    for name in enable:
        if name not in ENABLE_OPTIONS:
            raise OptionError(f"unknown enable option {name!r}; known: {sorted(ENABLE_OPTIONS)}")
    for name in disable:
        if name not in DISABLE_OPTIONS:
            raise OptionError(f"unknown disable option {name!r}; known: {sorted(DISABLE_OPTIONS)}")
    return Options(
        infer_contiguity="infer_contiguity" not in disable,
        kernel_codegen="kernel_codegen" not in disable,
        offset_checks="offset_checks" not in disable,
        check_layouts="check_layouts" in enable,
    )


def parse_options(enable: Sequence[str] = (), disable: Sequence[str] = ()) -> Options:
    """Options for one call: the arguments plus PYFUSER_/NVFUSER_ENABLE and _DISABLE from the environment."""
    if isinstance(enable, str) or isinstance(disable, str):
        raise OptionError("_enable_options/_disable_options take a list of option names, not a string")
    return _parse(tuple(enable), tuple(disable), _env_snapshot())
