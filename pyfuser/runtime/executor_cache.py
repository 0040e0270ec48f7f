"""FusionExecutorCache: input signature -> runtime (caching.md, level 1).

On every call the arguments are encoded into a signature: for tensors their sizes, strides, dtype, device,
data-pointer alignment class and negative/conjugate bits; for scalars their type, plus the value for integer and bool scalars (they can
set extents). A hit goes straight to the runtime: no validation, no segmentation, no meta inference. A miss
validates the inputs, then builds a runtime (segmentation, meta inference of boundary layouts).
"""

from __future__ import annotations

import logging
import numbers
import threading
import time
from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch

from ..errors import FusionExecutionError
from ..ir.fusion import Fusion
from ..ir.nodes import TensorView
from ..segment.segmenter import SegmentedFusion, segment_fusion
from .device_errors import DeviceErrorSink
from .fusion_runtime import FusionRuntime
from .options import Options, default_options, parse_options
from .validation import InputBinder, flatten_inputs

log = logging.getLogger("pyfuser")

MAX_VECTOR_BYTES = 16  # 128-bit vector loads: the largest alignment that matters


def alignment_class(ptr: int) -> int:
    """Largest power of two (bytes, capped at 16) that divides the address."""
    if ptr == 0:
        return MAX_VECTOR_BYTES
    return min(ptr & -ptr, MAX_VECTOR_BYTES)


# alignment_class by the address's low four bits: an index instead of a function call on every tensor of every call.
_ALIGNMENT_BY_LOW_BITS = tuple(alignment_class(low) for low in range(MAX_VECTOR_BYTES))


def _tensor_key(x: torch.Tensor) -> tuple:
    # The negative and conjugate bits change what the memory means (the plan resolves such inputs).
    return (x.shape, x.stride(), x.dtype, x.device, _ALIGNMENT_BY_LOW_BITS[x.data_ptr() & 15], x.is_neg(),
            x.is_conj())


def input_signature(flat: Sequence[Any]) -> tuple:
    sig = _flat_signature(flat)
    if sig is None:  # (a list or tuple among flattened inputs: encoded by type, as any other object)
        sig = tuple(_tensor_key(x) if isinstance(x, torch.Tensor) else _scalar_key(x) for x in flat)
    return sig


def _scalar_key(x) -> Any:
    if isinstance(x, numbers.Integral):  # bools and ints (numpy's too) can set extents: key on the value
        return type(x), int(x)
    return type(x)


def _flat_signature(inputs: Sequence[Any]) -> Optional[tuple]:
    """The signature of inputs that need no flattening, in one pass; None when one is a list or tuple (a
    define_vector's values: flatten_inputs first). Runs on every call: the common types are tested first and
    the encoding is inlined (input_signature's for every input)."""
    sig = []
    append = sig.append
    for x in inputs:
        tx = type(x)
        if tx is torch.Tensor or isinstance(x, torch.Tensor):
            append((x.shape, x.stride(), x.dtype, x.device, _ALIGNMENT_BY_LOW_BITS[x.data_ptr() & 15], x.is_neg(),
                    x.is_conj()))
        elif tx is int:
            append((int, x))
        elif tx is float:
            append(float)
        elif tx is list or tx is tuple:
            return None
        else:
            append(_scalar_key(x))
    return tuple(sig)


_MATMUL_OPS = ("matmul", "linear")


def _refuse_matmul(fusion: Fusion) -> None:
    """matmul_expr_eval disabled: matmul and linear have no segment kind left (pyfuser has no matmul kernel)."""
    for e in fusion.exprs:
        if e.op.name in _MATMUL_OPS:
            raise FusionExecutionError(
                f"Can not find a scheduler to schedule fusion segment: fd.ops.{e.op.name} ({e.outputs[0].name}) "
                f"runs only through ATen in pyfuser (it has no generated matmul kernel), and matmul_expr_eval is "
                f"disabled")


def _device_run(flat: Sequence[Any], device) -> bool:
    """Whether the call is a device run by its own choice: a device given, or a tensor input on a device. (A
    fusion whose tensors are all CPU scalars runs where torch computes them, on the host.)"""
    if device is not None:
        return torch.device(device).type != "cpu"
    return any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in flat)


def _refuse_computed_cpu_outputs(fusion: Fusion) -> None:
    """A device run cannot return a tensor computed only from CPU scalar tensors (``is_cpu`` inputs): nvFuser's
    kernels write device memory, and it refuses such a fusion rather than computing the value on the host.
    Returning a CPU scalar input itself is fine, and so is an op that also reads a device tensor."""
    on_host: set = {id(v) for v in fusion.inputs if isinstance(v, TensorView) and v.is_cpu}
    for e in fusion.exprs:
        tensors = [v for v in e.inputs if isinstance(v, TensorView)]
        if tensors and all(id(v) in on_host for v in tensors):
            on_host.update(id(o) for o in e.outputs)
    inputs = {id(v) for v in fusion.inputs}
    for out in fusion.outputs:
        if id(out) in on_host and id(out) not in inputs:
            raise FusionExecutionError(
                f"KernelExecutor does not support the Fusion provided: output {out.name} (fd.ops."
                f"{out.definition.op.name}) is computed only from CPU scalar tensors, and a device run returns no "
                f"computed CPU tensor (nvFuser refuses it too); combine it with a device tensor or compute it "
                f"outside the fusion")


class FusionExecutorCache:
    MAX_SIGNATURES = 100

    def __init__(self, fusion: Fusion):
        self.fusion = fusion
        self._binder = InputBinder(fusion)
        self._segmented: Optional[SegmentedFusion] = None
        self._runtimes: "OrderedDict[tuple, FusionRuntime]" = OrderedDict()
        self._lock = threading.Lock()
        self.last_runtime: Optional[FusionRuntime] = None
        self.stats = {"hits": 0, "misses": 0}
        # Errors found on the device (group offsets), shared by this fusion's runtimes (device_errors.py).
        self.errors = DeviceErrorSink()

    def execute(self, inputs: Sequence[Any], *, device=None, enable_options=(), disable_options=()) -> list:
        # The common call (a list of inputs, no explicit options) takes the fewest steps: options from the cached
        # environment, the signature in one pass over the inputs as given.
        if type(inputs) is list and not enable_options and not disable_options:
            options = default_options()
            flat, sig = inputs, _flat_signature(inputs)
            if sig is None:
                flat = flatten_inputs(inputs, self.fusion.inputs)
                sig = input_signature(flat)
            key = (options.bits, device, sig)
        else:
            options, flat, key = self._key(inputs, device, enable_options, disable_options)
        runtime = self._runtimes.get(key)
        if runtime is None:
            runtime = self._build(key, flat, device, options)
        else:
            self.stats["hits"] += 1
            # The last runtime is the most recently used already (across threads the order is approximate,
            # which only decides which signature is evicted first).
            if runtime is not self.last_runtime:
                try:
                    self._runtimes.move_to_end(key)  # least recently *used* goes first
                except KeyError:  # evicted by another thread meanwhile; the runtime in hand is still valid
                    pass
        self.last_runtime = runtime
        return runtime.run(flat)

    def _key(self, inputs, device, enable_options, disable_options) -> tuple:
        """(options, flat inputs, cache key) of a call. (execute inlines this for its common call.)"""
        options = parse_options(enable_options, disable_options)
        flat = flatten_inputs(inputs, self.fusion.inputs)
        return options, flat, (options.bits, device, input_signature(flat))

    def has_runtime(self, inputs: Sequence[Any], *, device=None, enable_options=(), disable_options=()) -> bool:
        """Whether a call with these inputs and options would be a cache hit."""
        return self._key(inputs, device, enable_options, disable_options)[2] in self._runtimes

    def _build(self, key, flat, device, options: Options) -> FusionRuntime:
        with self._lock:
            runtime = self._runtimes.get(key)
            if runtime is not None:
                return runtime
            self._binder.validate(flat, device)  # raises before anything is cached
            if not options.matmul_expr_eval:
                _refuse_matmul(self.fusion)
            if _device_run(flat, device):
                _refuse_computed_cpu_outputs(self.fusion)
            start = time.perf_counter()
            if self._segmented is None:
                self._segmented = segment_fusion(self.fusion)
            runtime = FusionRuntime(self._segmented, flat, options, device, self.errors)
            if log.isEnabledFor(logging.INFO):
                kinds = [r.runs_as for r in runtime.describe()]
                log.info("pyfuser: prepared a runtime for a new input signature in %.1f ms: %d segments (%d generated "
                         "kernels, %d hand-written, %d ATen); kernels compile at their first launch",
                         (time.perf_counter() - start) * 1e3, len(kinds), kinds.count("triton"),
                         kinds.count("op kernel"), kinds.count("aten"))
            self._runtimes[key] = runtime
            if len(self._runtimes) > self.MAX_SIGNATURES:
                self._runtimes.popitem(last=False)
            self.stats["misses"] += 1
            return runtime

    def num_runtimes(self) -> int:
        return len(self._runtimes)
