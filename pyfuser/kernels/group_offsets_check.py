"""The device check of group offsets (pyfuser/ops/offset_checks.py states the conditions) in one Triton launch.

The torch form of the same check costs about fifteen small kernels and their host time on every call of an NVFP4
op; this kernel is one program that loads the (few: one per expert) offsets, evaluates every condition and ORs
the bit mask into the call's error flags, which live in pinned host memory the GPU writes directly. It is attached to the op layer at import.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codegen.launcher import launch, next_pow2
from ..ops import offset_checks


@triton.jit
def _group_offsets_check_kernel(starts_ptr, outs_ptr, sizes_ptr, flags_ptr, slot, g, m, capacity, n, k,
                                sizes_stride, EVERY_ROW: tl.constexpr, HAS_OUTS: tl.constexpr,
                                HAS_SIZES: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < g
    last = i == g - 1
    s = tl.load(starts_ptr + i, mask=ok, other=0).to(tl.int64)
    # The next group's start; the last group runs to m (so s[-1] > m shows as a decrease).
    s_next = tl.load(starts_ptr + i + 1, mask=i + 1 < g, other=0).to(tl.int64)
    s_next = tl.where(last, m, s_next)
    bad = ok & ((s < 0) | (s_next < s))
    if EVERY_ROW:
        bad = bad | ((i == 0) & (s != 0))
    flags = tl.max(bad.to(tl.int32), axis=0)
    rows = s_next - s
    if HAS_OUTS:
        o = tl.load(outs_ptr + i, mask=ok, other=0).to(tl.int64)
        o_next = tl.load(outs_ptr + i + 1, mask=i + 1 < g, other=0).to(tl.int64)
        end = o + (rows + 127) // 128 * 128
        bad2 = ok & (((i == 0) & (o < 0)) | ((i + 1 < g) & (o_next < end)) | (last & (end > capacity)))
        flags = flags | tl.max(bad2.to(tl.int32), axis=0) * 2
    if HAS_SIZES:
        p0 = tl.load(sizes_ptr + i * sizes_stride, mask=ok, other=0).to(tl.int64)
        p1 = tl.load(sizes_ptr + i * sizes_stride + 1, mask=ok, other=0).to(tl.int64)
        p2 = tl.load(sizes_ptr + i * sizes_stride + 2, mask=ok, other=0).to(tl.int64)
        bad3 = ok & ((p0 != rows) | (p1 != n) | (p2 != k))
        flags = flags | tl.max(bad3.to(tl.int32), axis=0) * 4
    # The flags are pinned host memory (one program writes this slot): a plain read-modify-write keeps them sticky.
    tl.store(flags_ptr + slot, tl.load(flags_ptr + slot) | flags)


def group_offsets_flags(c, starts, outs, sizes, flags, slot: int) -> None:
    """ORs the check's bit mask into ``flags[slot]`` (int32), on the device, without a host read."""
    if starts.device.type != "cuda":  # the interpreter has no use for it: CPU checks read the values directly
        offset_checks.torch_device_flags(c, starts, outs, sizes, flags, slot)
        return
    g = starts.numel()
    sizes_stride = sizes.stride(0) if sizes is not None else 0
    tensors = (starts, outs if outs is not None else starts, sizes if sizes is not None else starts, flags)
    capacity = c.capacity if c.capacity is not None else 0
    launch(_group_offsets_check_kernel, (1,), tensors, (slot, g, c.m, capacity, c.n, c.k, sizes_stride),
           dict(EVERY_ROW=c.every_row, HAS_OUTS=outs is not None, HAS_SIZES=sizes is not None,
                BLOCK=max(next_pow2(g), 16)), 1)


offset_checks.attach_device_flags(group_offsets_flags)
