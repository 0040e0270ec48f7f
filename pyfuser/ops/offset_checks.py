"""Run-time checks of group offsets: the NVFP4 ops (layout op, grouped quantize, NVFP4 grouped GEMM) and grouped_mm.

Their dtype and length are metadata, checked by the op before its values (a prepared op kernel checks them once
per input signature). Their *values* live on the device, and reading them on the host is a synchronization, so
the mode of :mod:`run_context` decides:

- ``device`` (the default): a check computes a bit mask of problems on the device and ORs it into the call's
  error flags in pinned host memory (``RunContext.error_slot``); the runtime reads them without waiting and
  raises :class:`FusionExecutionError` naming the op and the input from a later call (docs/runtime.md says
  exactly when). Where no runtime collects flags (CPU runs, the reference executor) or the offsets are not on the
  run's device, the check reads the values at once: there it costs no synchronization.
- ``sync``: the values are read on the host at once (one device-to-host copy per op call) and a problem raises
  immediately, with the offending values in the message.
- ``off``: trusted, as upstream does.

Whatever the mode, the kernels never write outside their buffers: bad offsets give wrong placements, not memory
corruption.

The conditions, for ``g`` groups of an ``m``-row operand (one description, three implementations: host lists,
torch ops and the Triton kernel attached by pyfuser.kernels, which must agree):
1. ``starts`` (bit 1) non-decreasing in ``[0, m]``; with ``every_row``, ``starts[0] == 0``.
2. ``outs`` (bit 2, optional) — each group's padded block-scale rows ``[outs[i], outs[i] + roundup(rows_i, 128))``
   disjoint, in order, and inside ``[0, capacity)``; ``rows_i = starts[i+1] - starts[i]`` (the last up to ``m``).
3. ``problem_sizes`` (bit 4, optional) — ``(rows_i, n, k)`` per group.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import FusionExecutionError
from . import run_context
from .common import round_up

STARTS_BAD, OUTS_BAD, SIZES_BAD = 1, 2, 4


class GroupCheck:
    """One check site's static facts: the names shown in errors and the extents the values must respect."""

    __slots__ = (
        "op", "starts_name", "starts_what", "outs_name", "m", "every_row", "capacity", "capacity_what", "n", "k"
    )

    def __init__(self, op: str, m: int, *, starts_name: str = "input_offsets", starts_what: str = "start rows",
                 outs_name: str = "output_offsets",
                 every_row: bool = True, capacity: Optional[int] = None, capacity_what: str = "", n: int = 0,
                 k: int = 0):
        self.op, self.m, self.every_row = op, m, every_row
        self.starts_name, self.starts_what, self.outs_name = starts_name, starts_what, outs_name
        self.capacity, self.n, self.k = capacity, n, k
        # What holds the padded rows, for messages ("the buffer has 900 rows", "scale1 holds 32 ... rows").
        self.capacity_what = capacity_what or f"the block-scale buffer has {capacity} rows"

    def messages(self, bits: int) -> list[str]:
        start = " starting at 0" if self.every_row else ""
        out = []
        if bits & STARTS_BAD:
            out.append(f"fd.ops.{self.op}: {self.starts_name} must be non-decreasing {self.starts_what} in "
                       f"[0, {self.m}]{start}")
        if bits & OUTS_BAD:
            out.append(f"fd.ops.{self.op}: {self.outs_name} must place each group's rows, padded to a multiple of "
                       f"128, in order without overlap inside the block-scales ({self.capacity_what})")
        if bits & SIZES_BAD:
            out.append(f"fd.ops.{self.op}: problem_sizes must be (m_i, N={self.n}, K={self.k}) per expert, m_i "
                       f"the rows of group i")
        return out


def host_ints(*tensors: torch.Tensor) -> list[list[int]]:
    """The tensors' values as Python ints, with ONE device-to-host copy (each copy is a sync); CPU tensors are read
    in place (no copy to save, and the concatenation would cost more than the reads)."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.tolist() if t.dim() == 1 else t.reshape(-1).tolist() for t in tensors]
    flat = torch.cat([t.detach().reshape(-1).to(torch.int64) for t in tensors]).tolist()
    out, i = [], 0
    for t in tensors:
        out.append(flat[i:i + t.numel()])
        i += t.numel()
    return out


def _host_check(c: GroupCheck, starts: list[int], outs: Optional[list[int]], sizes: Optional[list[int]]) -> None:
    """The conditions on host lists, raising at once with the offending values."""
    op, g, m = c.op, len(starts), c.m
    if c.every_row and starts[0] != 0:
        raise FusionExecutionError(
            f"fd.ops.{op}: {c.starts_name} must start at 0 (rows before the first group have no place in the "
            f"layout), got {starts}"
        )
    rows = [b - a for a, b in zip(starts, starts[1:] + [m])]
    if starts[0] < 0 or min(rows) < 0:  # a negative row count: a decrease, or the last start past m
        raise FusionExecutionError(f"fd.ops.{op}: {c.starts_name} must be non-decreasing {c.starts_what} in "
                                   f"[0, {m}], got {starts}")
    if outs is not None:
        end = 0
        for i, (o, r) in enumerate(zip(outs, rows)):
            if o < end:
                raise FusionExecutionError(
                    f"fd.ops.{op}: {c.outs_name} {outs} overlap: group {i} starts at row {o}, but group {i - 1} "
                    f"occupies padded rows up to {end} (roundup of its {rows[i - 1]} rows to 128)"
                    if i else f"fd.ops.{op}: {c.outs_name} must be non-negative, got {outs}"
                )
            end = o + round_up(r, 128)
        if end > c.capacity:
            raise FusionExecutionError(f"fd.ops.{op}: {c.outs_name} {outs} need {end} block-scale rows, but "
                                       f"{c.capacity_what}")
    if sizes is not None and sizes != [x for r in rows for x in (r, c.n, c.k)]:
        got = [sizes[3 * i:3 * i + 3] for i in range(g)]
        raise FusionExecutionError(f"fd.ops.{op}: problem_sizes must be (m_i, N, K) per expert = "
                                   f"{[[r, c.n, c.k] for r in rows]}, got {got}")


def torch_flags(c: GroupCheck, starts: torch.Tensor, outs: Optional[torch.Tensor],
                sizes: Optional[torch.Tensor]) -> torch.Tensor:
    """The conditions as torch ops on the device: a 0-dim int32 bit mask, no host read."""
    s = starts.to(torch.int64)
    bad = (s[0] < 0) | (s[-1] > c.m) | (s[1:] < s[:-1]).any()
    if c.every_row:
        bad = bad | (s[0] != 0)
    flags = bad.to(torch.int32)
    rows = F.pad(s[1:], (0, 1), value=c.m) - s
    if outs is not None:
        o = outs.to(torch.int64)
        ends = o + (rows + 127) // 128 * 128
        bad = (o[0] < 0) | (ends[-1] > c.capacity) | (o[1:] < ends[:-1]).any()
        flags = flags | (bad.to(torch.int32) * OUTS_BAD)
    if sizes is not None:
        p = sizes.to(torch.int64)
        bad = ((p[:, 0] != rows) | (p[:, 1] != c.n) | (p[:, 2] != c.k)).any()
        flags = flags | (bad.to(torch.int32) * SIZES_BAD)
    return flags


# ``prepare_device_flags(check, starts, outs, sizes)`` returns ``flags_fn(starts, outs, sizes, flags, slot)``, which
# ORs the bit mask into ``flags[slot]`` (host memory the device writes) for tensors with the metadata of those it was
# prepared with. The torch form by default; pyfuser.kernels attaches a one-launch Triton kernel.
def torch_device_flags(c, starts, outs, sizes, flags: torch.Tensor, slot: int) -> None:
    """Accumulates on the device (a sticky copy of the flags), then copies the slot to the host asynchronously."""
    sticky = run_context.current().errors.device_flags(starts.device)[slot:slot + 1]
    sticky.bitwise_or_(torch_flags(c, starts, outs, sizes))
    flags[slot:slot + 1].copy_(sticky, non_blocking=True)


def prepare_torch_device_flags(c, starts, outs, sizes) -> Callable:
    return functools.partial(torch_device_flags, c)


_prepare_device_flags: Callable = prepare_torch_device_flags


def attach_device_flags(prepare: Callable) -> None:
    """Replace the torch form of the device check with a faster implementation of the same conditions."""
    global _prepare_device_flags
    _prepare_device_flags = prepare


class PreparedGroupCheck:
    """The value check of one check site (:func:`check_group_offsets`) for offsets of fixed metadata, as a prepared
    op kernel calls it on every call: the device check's launch is prepared at its first use, so a call only reads
    the mode, takes an error slot and launches (or, in the other modes, reads the values or does nothing).

    An op kernel that runs the check inside its own launch (the NVFP4 layout op, grouped quantize and decode GEMM:
    program 0 computes ``group_offsets_check.group_offsets_bits``) calls :meth:`device_flag` instead of the
    check itself, and launches with the flag it returns."""

    __slots__ = ("check", "_device_flags", "_flag_views")

    def __init__(self, check: GroupCheck):
        self.check = check
        self._device_flags = None
        self._flag_views: dict = {}  # (the flags' address, slot) -> the one-element int32 view of that slot

    def __call__(self, starts: torch.Tensor, outs: Optional[torch.Tensor] = None,
                 sizes: Optional[torch.Tensor] = None) -> None:
        where = self.device_slot(starts, outs, sizes)
        if where is None:
            return
        flags_fn = self._device_flags
        if flags_fn is None:
            flags_fn = self._device_flags = _prepare_device_flags(self.check, starts, outs, sizes)
        flags_fn(starts, outs, sizes, *where)

    def device_flag(self, starts: torch.Tensor, outs: Optional[torch.Tensor] = None,
                    sizes: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """:meth:`device_slot` as an op kernel that runs the check in its own launch wants it: the one int32 flag
        (a one-element view of ``flags[slot]``, made once per flags and slot) that its launch ORs the check's bits
        into; None where the check is off or was done on the host (then the launch runs without the check)."""
        where = self.device_slot(starts, outs, sizes)
        if where is None:
            return None
        flags, slot = where
        key = (flags.data_ptr(), slot)
        flag = self._flag_views.get(key)
        if flag is None:  # (the view keeps the flags alive: their address is not reused while it is cached)
            flag = self._flag_views[key] = flags[slot:slot + 1]
        return flag

    def device_slot(self, starts: torch.Tensor, outs: Optional[torch.Tensor] = None,
                    sizes: Optional[torch.Tensor] = None) -> Optional[tuple[torch.Tensor, int]]:
        """The call's mode applied short of the device check: (flags, slot) where the check is to OR its bits on
        the device (an op kernel may do that itself, in its own launch); None where it is off or was done here,
        on the host (a problem raises)."""
        ctx = run_context.current()
        if ctx is None:
            mode = run_context.OFFSET_CHECKS_DEVICE
        else:
            mode = ctx.offset_checks
            if mode == run_context.OFFSET_CHECKS_OFF:
                return None
        c = self.check
        # On the device where the run collects device flags (the runtime's choice: CUDA runs); else the values are
        # read now, which off the device (CPU) costs no synchronization. More checks in one call than the sink has
        # slots: this one reads its values now.
        where = None
        if (mode == run_context.OFFSET_CHECKS_DEVICE and ctx is not None and ctx.errors is not None
                and starts.device == ctx.device):
            where = ctx.error_slot(c)
        if where is None:
            values = iter(host_ints(*[t for t in (starts, outs, sizes) if t is not None]))
            _host_check(c, next(values), next(values) if outs is not None else None,
                        next(values) if sizes is not None else None)
        return where


def check_group_offsets(c: GroupCheck, starts: torch.Tensor, outs: Optional[torch.Tensor] = None,
                        sizes: Optional[torch.Tensor] = None) -> None:
    """Check the offsets' values as the call's mode says (module docstring). Shapes and dtypes are the caller's.
    (A call site that runs again with offsets of the same metadata keeps a :class:`PreparedGroupCheck` instead.)"""
    if starts.device.type != "meta":
        PreparedGroupCheck(c)(starts, outs, sizes)
