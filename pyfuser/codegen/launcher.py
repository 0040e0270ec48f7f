"""The one way pyfuser launches a Triton kernel, generated or hand-written.

Triton's JIT dispatch (``kernel[grid](...)``) binds and specializes every argument on every call: measured on the
H200's host, 20-100 us per launch, more than the GPU time of most fused kernels. A :class:`Launcher` therefore
launches each specialization it has seen before straight through the compiled kernel's launcher, with raw
pointers, keyed on everything Triton 3.x specializes runtime arguments on: pointer dtypes and 16-byte alignment,
integers equal to 1, divisible by 16 or outside int32, scalar types, and the constexpr values. Only the first
launch of a specialization goes through the JIT (which compiles, or loads Triton's on-disk cache).

Falls back to the JIT path, always correct but slow:
- while a profiler's launch hooks are installed (``triton.knobs.runtime.launch_enter_hook``/``exit_hook``): they
  need Triton's launch metadata, which only the JIT path builds;
- under the Triton interpreter (``TRITON_INTERPRET=1``), where nothing is compiled. Interpreted launches are
  serialized by one lock: the interpreter patches module state while it runs a kernel, so two threads
  interpreting at once corrupt each other;
- for good, after a direct launch failed (an incompatible Triton), with a warning;
- when ``PYFUSER_DIRECT_LAUNCH=0``.

``stats`` counts JIT and interpreted launches, for benchmarks (tests watch Triton's own JIT dispatch instead).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from functools import reduce
from operator import or_
from typing import Callable, Optional, Sequence

import torch

from .interpreter_compat import interpreting

log = logging.getLogger("pyfuser")

_data_ptr = torch.Tensor.data_ptr  # (mapped over a launch's tensors in C)
_INTERPRET_LOCK = threading.RLock()
_direct_enabled = os.environ.get("PYFUSER_DIRECT_LAUNCH", "1") != "0"
stats = {"jit": 0, "interpreted": 0}  # launches that took those paths (direct launches are not counted)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of host ints (``triton.cdiv`` is a Triton function: microseconds per call on the host)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), of host ints."""
    return 1 << max(int(n) - 1, 0).bit_length()


def triton_usable(device: torch.device) -> bool:
    """Triton kernels run on CUDA devices, and on CPU tensors under the Triton interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and interpreting())


_HOOKS: Optional[tuple] = None  # triton's (launch_enter_hook, launch_exit_hook) chains, looked up once


def _launch_hooks_installed() -> bool:
    global _HOOKS
    if _HOOKS is None:
        try:
            from triton import knobs

            _HOOKS = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
            _HOOKS[0].calls, _HOOKS[1].calls  # noqa: B018 (triton 3.6's HookChain: hooks are in .calls)
        except (ImportError, AttributeError):  # another Triton: its hooks cannot be inspected, so assume some
            _HOOKS = ()
    return not _HOOKS or bool(_HOOKS[0].calls or _HOOKS[1].calls)


def _int_spec(v: int) -> tuple:
    return v == 1, not v & 15, -2147483648 <= v < 2147483648  # (v & 15 == 0 iff v % 16 == 0, negatives too)


def _scalar_spec(v) -> object:
    if type(v) is int:
        return _int_spec(v)
    if type(v) is tuple:  # a tuple argument (a load prologue's arguments): Triton specializes each element
        return _tuple_spec_and_raw(v)[0]
    return type(v)


def _raw(v):
    """A scalar argument as the compiled launcher takes it: tensors inside tuples as their addresses."""
    if type(v) is tuple:
        return _tuple_spec_and_raw(v)[1]
    return v


# The specs of the integers met in tuple arguments (a prologue's sizes, strides and bounds: few distinct values):
# looked up instead of computed (bounded; an integer past the bound is computed every time).
_INT_SPECS: dict = {}
_INT_SPECS_MAX = 4096


def _tuple_spec_and_raw(v: tuple) -> tuple:
    """(specialization key, raw form) of a tuple argument in one pass: a load prologue's tuple holds a dozen or more
    pointers and integers, and this runs on every launch of its kernel, so ints and tensors are tested first (an
    int's spec looked up, a tensor's dtype and 16-byte alignment inlined)."""
    spec, raw = [], []
    for x in v:
        tx = type(x)
        if tx is int:
            int_spec = _INT_SPECS.get(x)
            if int_spec is None:
                int_spec = _int_spec(x)
                if len(_INT_SPECS) < _INT_SPECS_MAX:
                    _INT_SPECS[x] = int_spec
            spec.append(int_spec)
            raw.append(x)
        elif tx is torch.Tensor or isinstance(x, torch.Tensor):
            ptr = x.data_ptr()
            spec.append((x.dtype, not ptr & 15))
            raw.append(ptr)
        else:
            spec.append(_scalar_spec(x))
            raw.append(_raw(x))
    return tuple(spec), tuple(raw)


def _specs_and_raw(scalars: Sequence) -> tuple:
    """(specialization key, raw form) of a launch's scalars, some of them tuples."""
    specs, raws = [], []
    for v in scalars:
        if type(v) is tuple:
            spec, raw = _tuple_spec_and_raw(v)
            specs.append(spec)
            raws.append(raw)
        else:
            specs.append(_scalar_spec(v))
            raws.append(v)
    return tuple(specs), raws


class Launcher:
    """A Triton JIT function at fixed launch options (``num_warps``, ``num_stages``).

    ``launch(grid, tensors, scalars, constexprs)`` calls the kernel with its parameters in order: pointer
    arguments first, then runtime scalars, then constexpr values (given positionally)."""

    def __init__(self, fn, num_warps: int, num_stages: Optional[int] = None, name: Optional[str] = None,
                 compile_options: Optional[dict] = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", repr(fn))
        self.options = {"num_warps": num_warps, **(compile_options or {})}
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        self._compiled: dict = {}
        self._lock = threading.Lock()
        self._jit_only = False  # set when a direct launch with tuple arguments failed

    def launch(self, grid: Sequence[int], tensors: Sequence[torch.Tensor], scalars: Sequence = (),
               constexprs: Sequence = (), jit_tensors: Optional[Callable[[], Sequence[torch.Tensor]]] = None):
        """``jit_tensors()``, if given, builds the pointer arguments as the JIT path must see them (views of other
        dtypes at the same addresses as ``tensors``); they are only built on that path. Returns the compiled kernel's
        runner (:func:`compiled_runner`) when its specialization can be launched directly (None on the interpreter
        or while hooks force the JIT).
        A scalar may be a tuple (a load prologue's arguments, tensors included): its elements are part of the
        specialization key and its tensors are passed by address."""
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        first = tensors[0]
        if first.device.type != "cuda":
            with _INTERPRET_LOCK:
                stats["interpreted"] += 1
                self.fn[(g0, g1, g2)](*(jit_tensors() if jit_tensors else tensors), *scalars, *constexprs,
                                      **self.options)
            return
        direct = _direct_enabled and not self._jit_only and not _launch_hooks_installed()
        if direct:
            ptrs = [t.data_ptr() for t in tensors]
            key = (first.device.index, *[t.dtype for t in tensors], *[p % 16 == 0 for p in ptrs],
                   *map(_scalar_spec, scalars), *constexprs)
            runner = self._compiled.get(key)
            if runner is not None:
                try:
                    run, head = runner
                    stream = torch._C._cuda_getCurrentRawStream(first.device.index)  # the capture stream too
                    run(g0, g1, g2, stream, *head, *ptrs, *map(_raw, scalars), *constexprs)
                    return runner
                except Exception as e:  # an incompatible Triton: take the JIT path from now on
                    self._direct_failed(e, scalars)
                    direct = False
        start = time.perf_counter()
        compiled = self.fn[(g0, g1, g2)](*(jit_tensors() if jit_tensors else tensors), *scalars, *constexprs,
                                         **self.options)
        stats["jit"] += 1
        if direct and compiled is not None and hasattr(compiled, "run") and hasattr(compiled, "packed_metadata"):
            runner = compiled_runner(compiled)
            with self._lock:
                new = key not in self._compiled
                self._compiled[key] = runner
            if new and log.isEnabledFor(logging.INFO):
                log.info("pyfuser: kernel %s specialized and launched in %.1f ms (Triton compile or cache load)",
                         self.name, (time.perf_counter() - start) * 1e3)
            return runner
        return None

    def _direct_failed(self, e: Exception, scalars: Sequence) -> None:
        global _direct_enabled
        tuples = any(type(v) is tuple for v in scalars)
        warnings.warn(f"pyfuser: direct kernel launch failed ({type(e).__name__}: {e}); using Triton's JIT launch "
                      f"path from now on{' for ' + self.name if tuples else ''}")
        if tuples:  # only launches with tuple arguments are in doubt
            self._jit_only = True
        else:
            _direct_enabled = False

    def bind(self, grid: Sequence[int], fixed: Sequence, device: torch.device) -> "BoundLaunch":
        """A launch of this kernel with its grid, device and trailing arguments ``fixed`` (the constexprs, and any
        integers before them that are fixed too) bound once (see :class:`BoundLaunch`)."""
        return BoundLaunch(self, grid, fixed, device)


def compiled_runner(compiled) -> tuple:
    """``(run, head)``: ``run(gx, gy, gz, stream, *head, *args)`` launches the compiled kernel ``compiled``.

    Triton 3.6's compiled launcher (``CudaLauncher``) is a Python ``__call__`` that allocates the kernel's global
    and profile scratch buffers, if it has any, and then calls its C ``launch``. For a kernel with neither (every
    kernel pyfuser launches), ``run`` is that C function, with the scratch pointers and launch flags in ``head``:
    the Python frame, its closure and two calls are ~0.5 us of host time per launch. Anything else, or another
    Triton, gets ``compiled.run`` itself."""
    run = compiled.run
    launch = getattr(run, "launch", None)
    if (type(run).__name__ == "CudaLauncher" and launch is not None
            and getattr(run, "global_scratch_size", None) == 0 and getattr(run, "profile_scratch_size", None) == 0
            and hasattr(run, "launch_cooperative_grid") and hasattr(run, "launch_pdl")):
        return launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                        compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


class BoundLaunch:
    """One launch site whose grid, device and trailing arguments are fixed: a generated kernel's plan fixes them
    per input signature, and so does a prepared hand-written kernel (docs/runtime.md, "Prepared op kernels").

    ``bound(tensors, scalars=(), jit_tensors=None)`` passes ``(*tensors, *scalars, *fixed)``. The dtypes are
    fixed with the site, so a cached specialization is keyed by the pointers' 16-byte alignment and the per-call
    scalars' integer specialization alone (checked on every call: a launch never runs with assumptions its
    arguments break); the fixed arguments were keyed once, when the specialization was first launched through
    :meth:`Launcher.launch` (``jit_tensors`` as there), the first ``n_ints`` of them as runtime integers (by their
    specialization, so that sites of other sizes share the launcher's compiled kernels) and the rest as constexprs.
    ``tuple_scalars``: some scalar is a tuple (a load prologue's arguments), passed with its tensors as
    addresses."""

    __slots__ = ("launcher", "grid", "fixed", "n_ints", "device", "index", "cuda", "tuple_scalars", "_compiled")

    def __init__(self, launcher: Launcher, grid: Sequence[int], fixed: Sequence, device: torch.device,
                 n_ints: int = 0, tuple_scalars: bool = False):
        self.launcher = launcher
        self.grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        self.fixed = tuple(fixed)
        self.n_ints = n_ints
        self.device = device
        self.index = device.index
        self.cuda = device.type == "cuda"
        self.tuple_scalars = tuple_scalars
        self._compiled: dict = {}

    def __call__(self, tensors: Sequence[torch.Tensor], scalars: tuple = (),
                 jit_tensors: Optional[Callable[[], Sequence[torch.Tensor]]] = None) -> None:
        if self.cuda and _direct_enabled and not self.launcher._jit_only and not _launch_hooks_installed():
            ptrs = list(map(_data_ptr, tensors))
            # Usually every pointer is 16-byte aligned: one OR tells, and the key is then a constant.
            key = True if not reduce(or_, ptrs, 0) & 15 else tuple([p & 15 == 0 for p in ptrs])
            raws = scalars
            if scalars:
                if self.tuple_scalars:  # (their key and raw form in one pass)
                    specs, raws = _specs_and_raw(scalars)
                    key = (key, specs)
                else:
                    key = (key, tuple(map(_scalar_spec, scalars)))
            runner = self._compiled.get(key)
            if runner is not None:
                run, head = runner
                if not self.tuple_scalars:
                    run(*self.grid, torch._C._cuda_getCurrentRawStream(self.index), *head, *ptrs, *scalars,
                        *self.fixed)
                    return
                try:  # tuple arguments: a Triton whose compiled launcher does not take them sends this kernel to
                    run(*self.grid, torch._C._cuda_getCurrentRawStream(self.index), *head, *ptrs, *raws,  # the JIT
                        *self.fixed)
                    return
                except Exception as e:
                    self.launcher._direct_failed(e, scalars)
            runner = self._launch(tensors, scalars, jit_tensors)
            if runner is not None:
                self._compiled[key] = runner
            return
        self._launch(tensors, scalars, jit_tensors)

    def _launch(self, tensors, scalars, jit_tensors):
        n = self.n_ints
        return self.launcher.launch(self.grid, tensors, (*scalars, *self.fixed[:n]), self.fixed[n:], jit_tensors)


_LAUNCHERS: dict = {}
_LAUNCHERS_LOCK = threading.Lock()


def shared_launcher(kernel, num_warps: int, num_stages: Optional[int] = None, compile_options=None) -> Launcher:
    """The process's one :class:`Launcher` of a hand-written kernel at these launch options (a kernel always
    compiles with the same ``compile_options``): hand-written kernels are a fixed, small set, and sharing the
    launcher shares its compiled specializations among every call site (a prepared launch of a new input signature
    finds them compiled)."""
    key = (kernel, num_warps, num_stages)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        with _LAUNCHERS_LOCK:
            launcher = _LAUNCHERS.setdefault(key, Launcher(kernel, num_warps, num_stages,
                                                           compile_options=compile_options))
    return launcher


def launch(kernel, grid: Sequence[int], tensors: Sequence[torch.Tensor], ints: Sequence[int], meta: dict,
           num_warps: int, num_stages: Optional[int] = None, jit_tensors: Optional[Callable] = None) -> None:
    """Launch a hand-written kernel: ``kernel[grid](*tensors, *ints, **meta, num_warps=, num_stages=)``, its
    constexpr parameters (``meta``, in parameter order) last."""
    shared_launcher(kernel, num_warps, num_stages).launch(grid, tensors, ints, tuple(meta.values()), jit_tensors)


def bound_launch(kernel, grid: Sequence[int], ints: Sequence[int], meta: dict, num_warps: int,
                 num_stages: Optional[int] = None, *, device: torch.device, compile_options: Optional[dict] = None,
                 tuple_scalars: bool = False) -> BoundLaunch:
    """:func:`launch` prepared once: ``bound(tensors, scalars=(), jit_tensors=None)`` launches
    ``kernel[grid](*tensors, *scalars, *ints, **meta)``. What a prepared op kernel fixes per input signature."""
    launcher = shared_launcher(kernel, num_warps, num_stages, compile_options)
    return BoundLaunch(launcher, grid, (*ints, *meta.values()), device, len(ints), tuple_scalars)
