"""The device check of group offsets (pyfuser/ops/offset_checks.py states the conditions) in one Triton launch.

The torch form of the same check costs about fifteen small kernels and their host time on every call of an NVFP4
op; this kernel is one program that loads the (few: one per expert) offsets, evaluates every condition and ORs
the bit mask into the call's error flags, which live in pinned host memory the GPU writes directly. It is attached
to the op layer at import.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..codegen.launcher import bound_launch, next_pow2, triton_usable
from ..ops import offset_checks


@triton.jit
def group_offsets_bits(starts_ptr, outs_ptr, sizes_ptr, g, m, capacity, n, k, sizes_stride,
                       EVERY_ROW: tl.constexpr, HAS_OUTS: tl.constexpr, HAS_SIZES: tl.constexpr,
                       BLOCK: tl.constexpr):
    """The check's bit mask (offset_checks.STARTS_BAD | OUTS_BAD | SIZES_BAD) over the g groups, as a scalar.
    Also inlined into op kernels that read the same offsets (program 0 of the NVFP4 decode GEMM, the layout op and
    the grouped quantize), saving this launch."""
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
    return flags


@triton.jit
def or_into_flags(flag_ptr, bits):
    """ORs ``bits`` into the int32 flag at ``flag_ptr`` (pinned host memory: sticky across calls), touching it only
    when a bit is set. Its read-modify-write crosses the host link, and the program that makes it (program 0 of
    an op kernel that runs the check) finishes no sooner; valid offsets, every call but a faulty one, set no bit,
    so the kernel never waits on host memory."""
    bad = bits != 0
    tl.store(flag_ptr, tl.load(flag_ptr, mask=bad, other=0) | bits, mask=bad)


@triton.jit
def _group_offsets_check_kernel(starts_ptr, outs_ptr, sizes_ptr, flags_ptr, slot, g, m, capacity, n, k,
                                sizes_stride, EVERY_ROW: tl.constexpr, HAS_OUTS: tl.constexpr,
                                HAS_SIZES: tl.constexpr, BLOCK: tl.constexpr):
    flags = group_offsets_bits(starts_ptr, outs_ptr, sizes_ptr, g, m, capacity, n, k, sizes_stride, EVERY_ROW,
                               HAS_OUTS, HAS_SIZES, BLOCK)
    # (one program writes this slot: a plain read-modify-write keeps the flags sticky)
    or_into_flags(flags_ptr + slot, flags)


def check_block(g: int) -> int:
    """The BLOCK (lanes over the groups) of group_offsets_bits for g groups."""
    return max(next_pow2(g), 16)


def fused_check_args(c, g: int, sizes: bool = False) -> tuple[tuple[int, ...], dict]:
    """((check_m, check_capacity[, check_n, check_k]), the CHECK constexprs) of an op launch over g groups that
    runs the offsets' check in its program 0 (the NVFP4 layout op, grouped quantize and decode GEMM): with ``c``
    (an offset_checks.GroupCheck) the check that prepare_group_offsets_flags would launch, with the same extents;
    with None, the launch without it. ``sizes``: the kernel also checks problem_sizes against (n, k)."""
    if c is None:
        return (0, 0, 0, 0)[:4 if sizes else 2], dict(CHECK=False, CHECK_EVERY_ROW=False, CHECK_BLOCK=16)
    ints = (c.m, c.capacity if c.capacity is not None else 0) + ((c.n, c.k) if sizes else ())
    return ints, dict(CHECK=True, CHECK_EVERY_ROW=c.every_row, CHECK_BLOCK=check_block(g))


def prepare_group_offsets_flags(c, starts, outs, sizes):
    """``flags_fn(starts, outs, sizes, flags, slot)`` ORing the check's bit mask into ``flags[slot]`` (int32), on the
    device, without a host read, for offsets with the metadata of these (offset_checks.PreparedGroupCheck): the
    launch is bound once, so a call passes four pointers and the slot."""
    if not triton_usable(starts.device):  # (device flags off CUDA without the interpreter: the torch form)
        return offset_checks.prepare_torch_device_flags(c, starts, outs, sizes)
    g = starts.numel()
    has_outs, has_sizes = outs is not None, sizes is not None
    # The kernel reads the offsets with unit stride (problem_sizes with its row stride).
    dense = starts.stride(0) == 1 and (not has_outs or outs.stride(0) == 1)
    sizes_stride = sizes.stride(0) if has_sizes else 0
    capacity = c.capacity if c.capacity is not None else 0
    bound = bound_launch(_group_offsets_check_kernel, (1,), (g, c.m, capacity, c.n, c.k, sizes_stride),
                         dict(EVERY_ROW=c.every_row, HAS_OUTS=has_outs, HAS_SIZES=has_sizes,
                              BLOCK=check_block(g)), 1, device=starts.device)

    def flags_fn(starts, outs, sizes, flags, slot: int) -> None:
        if not dense:
            starts, outs = starts.contiguous(), outs.contiguous() if has_outs else None
        # Absent operands are never read: any pointer stands for them.
        bound((starts, outs if has_outs else starts, sizes if has_sizes else starts, flags), (slot,))

    return flags_fn


offset_checks.attach_device_flags(prepare_group_offsets_flags)
