"""Errors found on the device, reported without stalling the call that found them.

Checks that would need a host read of device values (group offsets of the NVFP4 ops and grouped_mm,
pyfuser/ops/offset_checks.py) instead OR a bit mask into an int32 flag of this sink, one slot per check in the
order the plan runs them. After each call the flags are copied to pinned host memory asynchronously, behind an
event. Each call first polls the event of the last copy, without waiting: once the GPU has finished the call that
set a flag, the next call of the same fusion raises :class:`FusionExecutionError` with the check's message, and
the flags are cleared. So an error is reported at the latest by the first call of that fusion after any
synchronization (``torch.cuda.synchronize()``, reading an output on the host), and never lost: flags stay set
until they are read.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch

from ..errors import FusionExecutionError

_MIN_SLOTS = 16


class DeviceErrorSink:
    def __init__(self):
        self._lock = threading.Lock()
        self._flags: dict = {}  # device -> int32 flags on that device
        self._host: dict = {}  # device -> pinned int32 copy
        self._event: dict = {}  # device -> event recorded after the last copy (None: nothing pending)
        self._checks: dict = {}  # (device, slot) -> the check that owns the slot (for its messages)

    def slot(self, device: torch.device, slot: int, check) -> torch.Tensor:
        """The flags tensor of ``device`` with room for ``slot``, remembering ``check`` for its messages."""
        flags = self._flags.get(device)
        if flags is None or flags.numel() <= slot:
            with self._lock:
                flags = self._flags.get(device)
                if flags is None or flags.numel() <= slot:
                    n = max(_MIN_SLOTS, 2 * (slot + 1))
                    grown = torch.zeros(n, dtype=torch.int32, device=device)
                    if flags is not None:
                        grown[:flags.numel()].copy_(flags)
                    flags = self._flags[device] = grown
                    self._host[device] = torch.zeros(n, dtype=torch.int32, pin_memory=True)
                    self._event[device] = None
        self._checks[(device, slot)] = check
        return flags

    def devices(self) -> list:
        return list(self._flags)

    def publish(self) -> None:
        """After a call: start copying the flags to the host unless the previous copy is still in flight (the
        flags are sticky, so the next copy carries whatever this one would have)."""
        for device, flags in self._flags.items():
            event = self._event[device]
            if event is not None and not event.query():
                continue
            self._host[device].copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._event[device] = event

    def poll(self) -> None:
        """Before a call: raise the errors of finished calls (never waits for the GPU)."""
        for device in list(self._flags):
            event = self._event[device]
            if event is None or not event.query():
                continue
            self._event[device] = None
            host = self._host[device]
            if not bool(host.any()):
                continue
            messages = []
            for slot, bits in enumerate(host.tolist()):
                if bits:
                    messages += self._checks[(device, slot)].messages(bits)
            self._flags[device].zero_()
            host.zero_()
            raise FusionExecutionError(
                "; ".join(messages) + " (found on the device by an earlier call of this fusion; its outputs are "
                "invalid. _enable_options=['sync_offset_checks'] checks on the host at once)")

    def check_now(self) -> None:
        """Synchronize and raise pending errors (tests, and the end of a sync-mode call)."""
        for device, flags in self._flags.items():
            self._host[device].copy_(flags)
            event = torch.cuda.Event()
            event.record()
            self._event[device] = event
        self.poll()


def new_sink(device: torch.device) -> Optional[DeviceErrorSink]:
    """A sink for runs on ``device``: only CUDA calls defer errors (elsewhere checks read values directly)."""
    return DeviceErrorSink() if device.type == "cuda" else None
