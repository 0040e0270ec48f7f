"""Errors found on the device, reported without stalling the call that found them.

Checks that would need a host read of device values (group offsets of the NVFP4 ops and grouped_mm,
pyfuser/ops/offset_checks.py) instead OR a bit mask into an int32 flag of this sink, one slot per check in the
order the plan runs them. The flags live in pinned host memory, which the GPU writes directly (page-locked host
memory is mapped into the device's address space): no copy, no event, no synchronization. Each call first reads
the flags on the host: once the GPU has finished a call that set one, the next call of the same fusion raises
:class:`FusionExecutionError` with the check's message, and the flags are cleared. So an error is reported at the
latest by the first call of that fusion after any synchronization (``torch.cuda.synchronize()``, reading an
output on the host). Flags stay set until read, so an error is never lost to later good calls.

Where a check runs as torch ops instead of its Triton kernel (``kernel_codegen`` disabled), it accumulates into
a device-side copy of the flags and copies them into the host flags asynchronously after each check.
"""

from __future__ import annotations

import threading

import torch

from ..errors import FusionExecutionError

SLOTS = 256  # checks per call; a plan with more checks reads the rest on the host (offset_checks.py)
_CLEAR = bytes(4 * SLOTS)  # the flags' bytes when no check has flagged anything


class DeviceErrorSink:
    """``origin``: who found the errors, as :meth:`poll` reports them (a fusion's runtimes share one sink; the
    nvf_cutlass functions another); ``remedy``: how the caller can have them reported sooner."""

    def __init__(self, origin: str = "an earlier call of this fusion; that call's outputs are invalid",
                 remedy: str = "_enable_options=['sync_offset_checks'] checks on the host at once"):
        self.origin, self.remedy = origin, remedy
        self._lock = threading.Lock()
        self._host: dict = {}  # device -> pinned int32 [SLOTS], written by the GPU
        self._bytes: dict = {}  # device -> a memoryview of those flags' bytes (poll compares them with zeros)
        self._device: dict = {}  # device -> int32 [SLOTS] on the device (the torch form of the checks)
        self._checks: dict = {}  # (device, slot) -> the check that owns the slot (for its messages)

    def host_flags(self, device: torch.device, slot: int, check):
        """The pinned flags the check of ``slot`` ORs into (None: no slot left, check on the host instead)."""
        if slot >= SLOTS:
            return None
        flags = self._host.get(device)
        if flags is None:
            flags = self._per_device(self._host, device, lambda: self._new_host_flags(device))
        self._checks[(device, slot)] = check
        return flags

    def _new_host_flags(self, device: torch.device) -> torch.Tensor:
        # Pinned on CUDA, so the GPU writes it directly; a CPU run (tests, benchmarks/bench_op_host.py: runtime
        # DEFERRED_ERROR_DEVICES) writes plain host memory.
        flags = torch.zeros(SLOTS, dtype=torch.int32, pin_memory=device.type == "cuda")
        self._bytes[device] = memoryview(flags.numpy()).cast("B")
        return flags

    def device_flags(self, device: torch.device) -> torch.Tensor:
        """The device-side sticky copy of the flags (the torch form of the checks accumulates there)."""
        return self._per_device(self._device, device,
                                lambda: torch.zeros(SLOTS, dtype=torch.int32, device=device))

    def _per_device(self, table: dict, device: torch.device, make):
        flags = table.get(device)
        if flags is None:
            with self._lock:
                flags = table.get(device)
                if flags is None:
                    flags = table[device] = make()
        return flags

    def flagged(self) -> bool:
        """Whether a finished call set any flag, i.e. whether :meth:`poll` would raise (a host memory read; never
        waits; False before any check of this fusion ran on the device). A copy of the 1 KiB and a compare per
        device, ~0.1 us, where host.any() (a torch op) costs ~2 us."""
        for device in self._host:
            if self._bytes[device].tobytes() != _CLEAR:
                return True
        return False

    def report_flagged(self, cuda: bool) -> None:
        """:meth:`poll`, where :meth:`flagged` said a flag is set, unless a caller's CUDA graph is capturing
        (``cuda``: the call runs on CUDA): host-side bookkeeping must not touch the captured stream (poll clears
        the device-side flags), so the report waits for a call outside the capture. Callers ask flagged() first:
        the capture query is a CUDA call, and most calls find no flag."""
        if not (cuda and torch.cuda.is_current_stream_capturing()):
            self.poll()

    def poll(self) -> None:
        """Before a call: raise the errors that finished calls flagged (a host memory read; never waits)."""
        for device, host in self._host.items():
            if self._bytes[device].tobytes() == _CLEAR:
                continue
            messages = []
            for slot, bits in enumerate(host.tolist()):
                if bits:
                    messages += self._checks[(device, slot)].messages(bits)
            host.zero_()
            if device in self._device:
                self._device[device].zero_()
            raise FusionExecutionError("; ".join(messages) + f" (found on the device by {self.origin}. {self.remedy})")
