"""What an evaluator may know about the call it runs in: the device and the group-offset check mode.

Evaluators receive values, not the runtime, so the runtime publishes these two facts here for the duration of a
call (context variables: threads and nested calls each see their own). The op layer defines them; the runtime
sets them.
"""

from __future__ import annotations

import contextvars
from typing import Optional

import torch

# How NVFP4 ops and grouped_mm check the *values* of group offsets (their dtype and length are always checked):
OFFSET_CHECKS_DEVICE = "device"  # on the device, no host sync; reported through the call's device-error sink
OFFSET_CHECKS_SYNC = "sync"  # read on the host at once: one device-to-host copy per op call
OFFSET_CHECKS_OFF = "off"  # trusted, as upstream does


class RunContext:
    """``device``: where the call runs ("meta" during layout inference). ``offset_checks``: one of the
    OFFSET_CHECKS_* modes. ``errors``: the runtime's device-error sink, or None where nothing collects device
    flags (the reference executor, layout inference): checks then read values directly. ``first_slot``: the sink
    slot of the call's first check (a plan numbers its checks from 0; a caller whose calls share one sink gives
    each check site a slot of its own)."""

    __slots__ = ("device", "offset_checks", "errors", "_next_slot")

    def __init__(self, device: torch.device, offset_checks: str = OFFSET_CHECKS_DEVICE, errors=None,
                 first_slot: int = 0):
        self.device = device
        self.offset_checks = offset_checks
        self.errors = errors
        self._next_slot = first_slot

    def error_slot(self, check) -> Optional[tuple[torch.Tensor, int]]:
        """(flags, slot): the pinned int32 error flags (written by the device) and the slot ``check`` ORs its bit
        mask into; ``check.messages(bits)`` explains a nonzero value. Slots are numbered in the order checks run
        within one call, which the plan fixes. None when the sink has no slot left."""
        slot = self._next_slot
        self._next_slot += 1
        flags = self.errors.host_flags(self.device, slot, check)
        return None if flags is None else (flags, slot)


_CURRENT: contextvars.ContextVar[Optional[RunContext]] = contextvars.ContextVar("pyfuser_run_context", default=None)


def default_device() -> torch.device:
    """Where a fusion without tensor inputs runs: the current CUDA device, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def current() -> Optional[RunContext]:
    return _CURRENT.get()


def run_device() -> torch.device:
    """The device of the call being evaluated ("meta" during layout inference)."""
    ctx = _CURRENT.get()
    return default_device() if ctx is None else ctx.device


def offset_checks() -> str:
    ctx = _CURRENT.get()
    return OFFSET_CHECKS_DEVICE if ctx is None else ctx.offset_checks


def enter(ctx: RunContext):
    """Make ``ctx`` current; returns the token for :func:`leave`."""
    return _CURRENT.set(ctx)


def leave(token) -> None:
    _CURRENT.reset(token)
