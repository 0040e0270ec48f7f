"""FusionExecutorCache: input signature -> runtime (caching.md, level 1).

A call's arguments are encoded into a signature (signature.py: for tensors their sizes, strides, dtype, device,
data-pointer alignment class and negative/conjugate bits; for scalars their type, plus the value for integer and
bool scalars, which can set extents), unless the last runtime's input guard recognizes them as that runtime's
(input_guard.py: the usual repeated call, checked mostly in C++). A hit goes straight to the runtime: no
validation, no segmentation, no meta inference. A miss validates the inputs, then builds a runtime (segmentation,
meta inference of boundary layouts).
"""

from __future__ import annotations

import logging
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
from .input_guard import InputGuard
from .options import Options, default_options, parse_options
from .signature import alignment_class, flat_signature, input_signature  # noqa: F401  (alignment_class: tests)
from .validation import InputBinder, flatten_inputs

log = logging.getLogger("pyfuser")

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
                f"{out.defined_by.op.name}) is computed only from CPU scalar tensors, and a device run returns no "
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
        options = default_options() if not enable_options and not disable_options else \
            parse_options(enable_options, disable_options)
        last = self.last_runtime
        if last is not None and type(inputs) is list:
            # The usual call repeats the last one's signature: its runtime's guard tells (input_guard.py).
            guard = last.input_guard
            if guard and guard.options_bits == options.bits and guard.device == device and guard.matches(inputs):
                self.stats["hits"] += 1
                return last.run(inputs)
        flat, sig = self._signature(inputs)
        key = (options.bits, device, sig)
        runtime = self._runtimes.get(key)
        if runtime is None:
            runtime = self._build(key, flat, device, options)
        else:
            self.stats["hits"] += 1
            # The last runtime is the most recently used already (across threads the order is approximate,
            # which only decides which signature is evicted first).
            if runtime is not last:
                try:
                    self._runtimes.move_to_end(key)  # least recently *used* goes first
                except KeyError:  # evicted by another thread meanwhile; the runtime in hand is still valid
                    pass
        if runtime.input_guard is None and flat is inputs:  # (False: none can be built)
            runtime.input_guard = InputGuard.build(options.bits, device, inputs) or False
        self.last_runtime = runtime
        return runtime.run(flat)

    def _signature(self, inputs) -> tuple:
        """(flat inputs, signature): a list that needs no flattening is encoded in one pass, as given."""
        sig = flat_signature(inputs) if type(inputs) is list else None
        if sig is not None:
            return inputs, sig
        flat = flatten_inputs(inputs, self.fusion.inputs)
        return flat, input_signature(flat)

    def has_runtime(self, inputs: Sequence[Any], *, device=None, enable_options=(), disable_options=()) -> bool:
        """Whether a call with these inputs and options would be a cache hit."""
        options = parse_options(enable_options, disable_options)
        return (options.bits, device, self._signature(inputs)[1]) in self._runtimes

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
