"""Launching the hand-written NVFP4 kernels without Triton's per-call argument binding.

Triton's JIT binds and specializes every argument on every call: measured on the H200's host, ~20-100 us per
launch, against 3-25 us of GPU time for a decode-sized layout op, quantize or grouped GEMM. After the first launch
of a specialization, later ones go straight to its compiled launcher with raw pointers, keyed on everything Triton
3.x specializes runtime arguments on: pointer dtypes and 16-byte alignment, integers equal to 1, divisible by 16,
or outside int32, plus the meta-parameters and launch options. ``PYFUSER_NVFP4_FAST_LAUNCH=0`` keeps every launch
on the JIT path; launches with profiler hooks installed always take it (they need Triton's launch metadata).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Optional, Sequence

import torch
from triton.compiler import CompiledKernel
from triton.runtime import driver

_FAST_LAUNCH = os.environ.get("PYFUSER_NVFP4_FAST_LAUNCH", "1") != "0"
_COMPILED: dict = {}


def _no_launch_hooks() -> bool:
    try:
        from triton import knobs

        return not knobs.runtime.launch_enter_hook.calls and not knobs.runtime.launch_exit_hook.calls
    except (ImportError, AttributeError):
        return False


def _int_spec(v: int) -> tuple:
    return v == 1, v % 16 == 0, -(2**31) <= v < 2**31


def launch(kernel, grid: Sequence[int], tensors: Sequence[torch.Tensor], ints: Sequence[int], meta: dict,
           num_warps: int, num_stages: Optional[int] = None, jit_tensors: Optional[Callable] = None) -> None:
    """``kernel[grid](*tensors, *ints, **meta, num_warps=, num_stages=)``: the kernel's pointer arguments come first,
    then its integer arguments. ``jit_tensors()``, if given, builds the pointer arguments as the JIT path must see
    them (views of other dtypes at the same addresses as ``tensors``); they are only built on that path."""
    global _FAST_LAUNCH
    grid = tuple(grid) + (1,) * (3 - len(grid))
    fast = _FAST_LAUNCH and tensors[0].device.type == "cuda" and _no_launch_hooks()
    if fast:
        ptrs = [t.data_ptr() for t in tensors]
        key = (kernel, tensors[0].device.index, num_warps, num_stages, *meta.values(), *[t.dtype for t in tensors],
               *[p % 16 == 0 for p in ptrs], *map(_int_spec, ints))
        compiled = _COMPILED.get(key)
        if compiled is not None:
            try:
                stream = driver.active.get_current_stream(tensors[0].device.index)
                compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None,
                             None, None, *ptrs, *ints, *meta.values())
                return
            except Exception as e:  # an incompatible Triton: fall back to the JIT path for good
                warnings.warn(f"pyfuser.nvfp4: direct kernel launch failed ({type(e).__name__}: {e}); using "
                              "Triton's JIT launch path from now on")
                _FAST_LAUNCH = False
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    args = jit_tensors() if jit_tensors is not None else tensors
    compiled = kernel[grid](*args, *ints, **meta, **options)
    if fast and isinstance(compiled, CompiledKernel):
        _COMPILED[key] = compiled
