"""Counting sort of small-range integer keys in one Triton program: a stable argsort, its inverse permutation
and the histogram of the keys, all from two passes over the keys.

For keys known to lie in ``[0, n_bins)`` (segment/counting_sort.py says when the segmenter uses this), the stable
ascending argsort is a counting sort: count each key (pass 1), scan the counts into each key's first position,
then give every element the first free position of its key, in index order (pass 2). ``perm[pos] = i`` is the
argsort, and ``inv[i] = pos`` is its inverse permutation (= the argsort of ``perm``). Both passes walk the keys in
blocks of ``BLOCK_M`` against all ``BLOCK_B`` bins at once (an [BLOCK_M, BLOCK_B] one-hot tile), so registers stay
bounded whatever the number of keys: the running counts carry the order from block to block.

One program does everything (a single CTA: the scan needs every count, and one launch is the point), so the kernel
is meant for the few thousand to few tens of thousands of keys of an MoE routing table, not for millions.

An *epilogue* may follow in the same launch: a generated single-program kernel (codegen/epilogue.py) that reads
the counts this program wrote, called after a barrier (a CTA-wide barrier makes the program's global writes
visible to all its threads).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..codegen.kernel_builder import COMPILE_OPTIONS
from ..codegen.launcher import bound_launch, next_pow2

MAX_BINS = 1024  # more distinct keys than this stay on ATen's sort (the one-hot tile would be too narrow in M)
_TILE_ELEMS = 8192  # elements of the one-hot tile: BLOCK_M * BLOCK_B
_MAX_BLOCK_M = 1024


def block_sizes(n_bins: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_B, num_warps) for ``n_bins`` bins: 8 bins -> a [1024, 8] tile, 8 warps."""
    block_b = next_pow2(max(n_bins, 1))
    block_m = max(16, min(_MAX_BLOCK_M, _TILE_ELEMS // block_b))
    num_warps = 8 if block_m * block_b >= 4096 else 4
    return block_m, block_b, num_warps


@triton.jit
def _counting_sort(keys_ptr, perm_ptr, inv_ptr, counts_ptr, m, keys_stride, perm_stride, inv_stride, n_counts,
                   counts_stride, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr, HAS_PERM: tl.constexpr,
                   HAS_INV: tl.constexpr, HAS_COUNTS: tl.constexpr):
    bins = tl.arange(0, BLOCK_B)
    # Pass 1: the histogram. Masked-off lanes load -1, which matches no bin.
    counts = tl.zeros([BLOCK_B], dtype=tl.int32)
    for start in range(0, m, BLOCK_M):
        offs = start + tl.arange(0, BLOCK_M)
        key = tl.load(keys_ptr + offs.to(tl.int64) * keys_stride, mask=offs < m, other=-1).to(tl.int32)
        counts += tl.sum((key[:, None] == bins[None, :]).to(tl.int32), axis=0)
    if HAS_PERM or HAS_INV:
        # Pass 2: each element's position = first position of its key + equal keys before it (index order, so the
        # sort is stable). ``base`` holds, per key, the next free position after the blocks already placed.
        base = tl.cumsum(counts, axis=0) - counts
        for start in range(0, m, BLOCK_M):
            offs = start + tl.arange(0, BLOCK_M)
            ok = offs < m
            key = tl.load(keys_ptr + offs.to(tl.int64) * keys_stride, mask=ok, other=-1).to(tl.int32)
            hit = (key[:, None] == bins[None, :]).to(tl.int32)
            before = tl.cumsum(hit, axis=0) - hit
            pos = tl.sum(hit * (base[None, :] + before), axis=1)
            if HAS_PERM:
                tl.store(perm_ptr + pos.to(tl.int64) * perm_stride, offs.to(tl.int64), mask=ok)
            if HAS_INV:
                tl.store(inv_ptr + offs.to(tl.int64) * inv_stride, pos.to(tl.int64), mask=ok)
            base += tl.sum(hit, axis=0)
    if HAS_COUNTS:
        tl.store(counts_ptr + bins * counts_stride, counts.to(counts_ptr.dtype.element_ty), mask=bins < n_counts)


@triton.jit
def _counting_sort_kernel(keys_ptr, perm_ptr, inv_ptr, counts_ptr, m, keys_stride, perm_stride, inv_stride,
                          n_counts, counts_stride, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
                          HAS_PERM: tl.constexpr, HAS_INV: tl.constexpr, HAS_COUNTS: tl.constexpr):
    _counting_sort(keys_ptr, perm_ptr, inv_ptr, counts_ptr, m, keys_stride, perm_stride, inv_stride, n_counts,
                   counts_stride, BLOCK_M, BLOCK_B, HAS_PERM, HAS_INV, HAS_COUNTS)


@triton.jit
def _counting_sort_epilogue_kernel(keys_ptr, perm_ptr, inv_ptr, counts_ptr, m, keys_stride, perm_stride,
                                   inv_stride, n_counts, counts_stride, EPI_ARGS, BLOCK_M: tl.constexpr,
                                   BLOCK_B: tl.constexpr, HAS_PERM: tl.constexpr, HAS_INV: tl.constexpr,
                                   HAS_COUNTS: tl.constexpr, EPILOGUE: tl.constexpr):
    # A separate entry: the epilogue's arguments travel as one tuple, which the plain kernel does not take.
    _counting_sort(keys_ptr, perm_ptr, inv_ptr, counts_ptr, m, keys_stride, perm_stride, inv_stride, n_counts,
                   counts_stride, BLOCK_M, BLOCK_B, HAS_PERM, HAS_INV, HAS_COUNTS)
    tl.debug_barrier()  # the counts (and perm/inv) stored above are read back by the epilogue's threads
    EPILOGUE(EPI_ARGS)


def counting_sort(keys: torch.Tensor, n_bins: int, perm: Optional[torch.Tensor] = None,
                  inv: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
                  epilogue: Optional[tuple] = None) -> None:
    """Writes, for 1-D integer ``keys`` whose every value lies in ``[0, n_bins)`` (the caller's guarantee, not
    checked): ``perm`` = torch.argsort(keys, stable=True), ``inv`` = its inverse permutation (torch.argsort(perm)),
    ``counts[e]`` = number of keys equal to e for e < counts.numel() (all 1-D, any strides; each may be None).
    ``epilogue`` = (jit function, argument tuple) runs after them in the same program. The same as preparing a
    :class:`CountingSort` and calling it once."""
    fn, args = epilogue if epilogue is not None else (None, None)
    CountingSort(keys, n_bins, perm, inv, counts, fn)(keys, perm, inv, counts, args)


class CountingSort:
    """:func:`counting_sort` for arguments of fixed metadata (sizes and strides; which outputs exist) and a fixed
    epilogue function: its one launch bound once (a CountingSort segment's step keeps one per input signature), so
    a call passes four pointers and the epilogue's argument tuple."""

    def __init__(self, keys, n_bins: int, perm=None, inv=None, counts=None, epilogue_fn=None):
        m = keys.numel()
        n_counts = counts.numel() if counts is not None else 0
        block_m, block_b, num_warps = block_sizes(max(n_bins, n_counts))
        stride = lambda t: t.stride(0) if t is not None else 0  # noqa: E731
        ints = (m, stride(keys), stride(perm), stride(inv), n_counts, stride(counts))
        meta = dict(BLOCK_M=block_m, BLOCK_B=block_b, HAS_PERM=perm is not None, HAS_INV=inv is not None,
                    HAS_COUNTS=counts is not None)
        # Compiled as generated kernels are (no multiply-add contraction, no flushed subnormals): the epilogue's
        # ops must round as they do op by op. (The sort itself is integer work, exact under any options.)
        if epilogue_fn is None:
            self.ints = ()
            self.launch = bound_launch(_counting_sort_kernel, (1,), ints, meta, num_warps, device=keys.device,
                                       compile_options=COMPILE_OPTIONS)
        else:  # the epilogue's argument tuple follows the integers: they are passed per call with it
            self.ints = ints
            self.launch = bound_launch(_counting_sort_epilogue_kernel, (1,), (), dict(meta, EPILOGUE=epilogue_fn),
                                       num_warps, device=keys.device, compile_options=COMPILE_OPTIONS,
                                       tuple_scalars=True)

    def __call__(self, keys, perm=None, inv=None, counts=None, epilogue_args: Optional[tuple] = None) -> None:
        # Absent outputs are never written: the keys stand for their pointers.
        tensors = (keys, perm if perm is not None else keys, inv if inv is not None else keys,
                   counts if counts is not None else keys)
        self.launch(tensors, () if epilogue_args is None else (*self.ints, epilogue_args))
