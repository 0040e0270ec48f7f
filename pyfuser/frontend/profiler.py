"""``PythonProfiler``: per-segment kernel names and device times of the fusions run inside a ``with`` block.

>>> with PythonProfiler() as prof:
...     fd.execute(inputs)
>>> prof.profile.segments, [(k.name, k.scheduler, k.time_ms, k.percentage_peak_bandwidth)
...                          for k in prof.profile.kernel_profiles]

One ``KernelProfile`` per segment of the last fusion executed in the block (nvFuser's shape of the result):
``name`` (the generated Triton kernel's name, or ``aten:<ops>`` for a segment ATen runs), ``scheduler`` (the
segment kind; ``"user"`` for ``manual_execute``), ``segment_id``, ``input_bytes``/``output_bytes`` (segment
boundary tensors), and on CUDA, from torch.profiler's device activity: ``time_ms`` (device time of the
segment's kernels), ``effective_bandwidth_gbs`` and ``percentage_peak_bandwidth``, the percentage of the
device's *measured* copy bandwidth (a device-to-device copy of 256 MiB, timed once per device), which nvFuser
does not report.

Attribution on CUDA: a Triton segment's kernel is found by its name; device kernels that match no Triton
segment belong to the ATen segments, in launch order, between the Triton kernels around them (consecutive ATen
segments with no Triton kernel between them share the run: it is given to the first, the others get 0 kernels).
Without CUDA the times are None.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..ir.nodes import TensorView

_active: list = []
_lock = threading.Lock()


@dataclass
class KernelProfile:
    name: str
    scheduler: str
    segment_id: int
    input_bytes: int = 0
    output_bytes: int = 0
    time_ms: Optional[float] = None
    kernel_names: list = field(default_factory=list)  # device kernels attributed to this segment
    effective_bandwidth_gbs: Optional[float] = None
    percentage_peak_bandwidth: Optional[float] = None
    device: int = -1

    @property
    def kernel_time_ms(self) -> Optional[float]:
        return self.time_ms

    def __repr__(self) -> str:
        t = "n/a" if self.time_ms is None else f"{self.time_ms:.4f} ms"
        bw = "" if self.percentage_peak_bandwidth is None else f", {self.percentage_peak_bandwidth:.1f}% of copy BW"
        return f"KernelProfile(segment {self.segment_id} [{self.scheduler}] {self.name}: {t}{bw})"


@dataclass
class FusionProfile:
    fusion_id: int = -1
    segments: int = 0
    kernel_profiles: list = field(default_factory=list)
    time_ms: Optional[float] = None  # sum of the segments' device times

    def __repr__(self) -> str:
        lines = [f"FusionProfile(fusion {self.fusion_id}, {self.segments} segments)"]
        lines += [f"  {k!r}" for k in self.kernel_profiles]
        return "\n".join(lines)


def notify(fusion_id: int, runtime, scheduler: Optional[str] = None, fusion=None) -> None:
    """Called by the frontend after each execution (``runtime`` None for manual_execute)."""
    if not _active:
        return
    with _lock:
        for prof in _active:
            prof._runs.append((fusion_id, runtime, scheduler, fusion))


def _boundary_bytes(runtime, vals) -> int:
    """Bytes of a segment's boundary tensors, from the layouts the runtime inferred for this run."""
    from ..ir.dtypes import to_torch_dtype

    total = 0
    for v in vals:
        layout = runtime.layouts.get(id(v)) if isinstance(v, TensorView) else None
        if layout is None:
            continue
        n = 1
        for s in layout.sizes:
            n *= int(s)
        try:
            total += n * torch.empty((), dtype=to_torch_dtype(v.dtype)).element_size()
        except Exception:  # noqa: BLE001 -- packed FP4 and other dtypes without a torch element: not counted
            continue
    return total


_copy_bw: dict = {}


def measured_copy_bandwidth_gbs(device: torch.device) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s), measured once per device."""
    key = str(device)
    if key not in _copy_bw:
        n = 256 * 1024 * 1024
        src = torch.empty(n, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        reps = 10
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1e3 / reps
        _copy_bw[key] = 2 * n / seconds / 1e9
        del src, dst
    return _copy_bw[key]


class PythonProfiler:
    """Context manager; ``prof.profile`` is the FusionProfile of the last fusion run inside the block."""

    def __init__(self, auto_scheduled: bool = True):
        self.auto_scheduled = auto_scheduled
        self.profile = FusionProfile()
        self._runs: list = []
        self._torch_prof = None

    def __enter__(self):
        self._runs = []
        if torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            self._torch_prof = profile(activities=[ProfilerActivity.CUDA])
            self._torch_prof.__enter__()
        with _lock:
            _active.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            _active.remove(self)
        events = []
        if self._torch_prof is not None:
            torch.cuda.synchronize()
            self._torch_prof.__exit__(*exc)
            events = _device_kernels(self._torch_prof)
        if exc[0] is None and self._runs:
            self.profile = self._build(events)
        return False

    def get_fusion_profile(self) -> FusionProfile:
        return self.profile

    def _build(self, events) -> FusionProfile:
        fusion_id, runtime, scheduler, fusion = self._runs[-1]
        if runtime is None:  # manual_execute: the whole fusion, unsegmented
            ops = [] if fusion is None else [e.op.name for e in fusion.exprs]
            prof = KernelProfile(name="aten:" + ",".join(ops), scheduler=scheduler or "user", segment_id=0)
            prof.kernel_names = [e[0] for e in events]
            if events:
                prof.time_ms = sum(e[1] for e in events)
            return FusionProfile(fusion_id=max(fusion_id, 0), segments=1, kernel_profiles=[prof],
                                 time_ms=prof.time_ms)
        reports = runtime.describe()
        profiles = []
        for r, seg in zip(reports, runtime.segments):
            name = r.kernel_name if r.kernel_name else "aten:" + ",".join(r.ops)
            profiles.append(KernelProfile(
                name=name, scheduler=r.kind, segment_id=r.index,
                input_bytes=_boundary_bytes(runtime, seg.inputs),
                output_bytes=_boundary_bytes(runtime, seg.outputs),
            ))
        if events:
            _attribute(profiles, reports, events)
            device = getattr(runtime, "device", None)
            if device is not None and getattr(device, "type", None) == "cuda":
                peak = measured_copy_bandwidth_gbs(device)
                for p in profiles:
                    p.device = device.index if device.index is not None else torch.cuda.current_device()
                    if p.time_ms:
                        p.effective_bandwidth_gbs = (p.input_bytes + p.output_bytes) / (p.time_ms / 1e3) / 1e9
                        p.percentage_peak_bandwidth = 100.0 * p.effective_bandwidth_gbs / peak
        total = None if not events else sum(p.time_ms or 0.0 for p in profiles)
        return FusionProfile(fusion_id=fusion_id, segments=len(profiles), kernel_profiles=profiles, time_ms=total)


def _device_kernels(torch_prof) -> list:
    """(name, device ms) of every device kernel, in start order."""
    out = []
    for e in torch_prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            ms = (getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0) / 1e3
            start = getattr(getattr(e, "time_range", None), "start", 0)
            out.append((e.name, ms, start))
    out.sort(key=lambda x: x[2])
    return [(n, ms) for n, ms, _ in out]


def _attribute(profiles: list, reports: list, events: list) -> None:
    triton_names = {r.kernel_name: i for i, r in enumerate(reports) if r.kernel_name}
    pending_aten: list = []  # the ATen segment taking the unmatched kernels after the last Triton one
    order = list(range(len(reports)))
    pos = 0  # next segment in run order
    for name, ms in events:
        hit = next((i for n, i in triton_names.items() if name == n or name.startswith(n + "_") or n in name), None)
        if hit is not None:
            p = profiles[hit]
            p.kernel_names.append(name)
            p.time_ms = (p.time_ms or 0.0) + ms
            pos = max(pos, order.index(hit) + 1)
            pending_aten = []
            continue
        # an ATen kernel: the first ATen segment at or after the last Triton segment seen
        if not pending_aten:
            pending_aten = [i for i in order[pos:] if not reports[i].kernel_name][:1]
        if pending_aten:
            p = profiles[pending_aten[0]]
            p.kernel_names.append(name)
            p.time_ms = (p.time_ms or 0.0) + ms
    for p in profiles:
        if p.time_ms is None:
            p.time_ms = 0.0
