"""The input signature of an execute call: what decides which runtime (and plan) serves it.

Per tensor its sizes, strides, dtype, device, data-pointer alignment class (up to 16 bytes) and negative and
conjugate bits; per scalar its type, and the value for ints and bools (they can set extents). Everything a plan
assumes about its inputs is here, so two calls of one signature can share a plan. Computed on every call that the
last runtime's input guard does not recognize (input_guard.py), so the common cases come first.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

import torch

MAX_VECTOR_BYTES = 16  # 128-bit vector loads: the largest alignment that matters


def alignment_class(ptr: int) -> int:
    """Largest power of two (bytes, capped at 16) that divides the address."""
    if ptr == 0:
        return MAX_VECTOR_BYTES
    return min(ptr & -ptr, MAX_VECTOR_BYTES)


# alignment_class by the address's low four bits: an index instead of a function call on every tensor of every call.
ALIGNMENT_BY_LOW_BITS = tuple(alignment_class(low) for low in range(MAX_VECTOR_BYTES))


def tensor_key(x: torch.Tensor) -> tuple:
    # The negative and conjugate bits change what the memory means (the plan resolves such inputs).
    return (x.shape, x.stride(), x.dtype, x.device, ALIGNMENT_BY_LOW_BITS[x.data_ptr() & 15], x.is_neg(),
            x.is_conj())


def scalar_key(x) -> Any:
    tx = type(x)
    if tx is int:
        return int, x
    if tx is float:
        return float
    if isinstance(x, numbers.Integral):  # bools and ints (numpy's too) can set extents: key on the value
        return tx, int(x)
    return tx


def input_signature(flat: Sequence[Any]) -> tuple:
    sig = flat_signature(flat)
    if sig is None:  # (a list or tuple among flattened inputs: encoded by type, as any other object)
        sig = tuple(tensor_key(x) if isinstance(x, torch.Tensor) else scalar_key(x) for x in flat)
    return sig


def flat_signature(inputs: Sequence[Any]) -> Optional[tuple]:
    """The signature of inputs that need no flattening, in one pass; None when one is a list or tuple (a
    define_vector's values: flatten_inputs first). tensor_key and scalar_key inlined for the common types."""
    sig = []
    append = sig.append
    for x in inputs:
        tx = type(x)
        if tx is torch.Tensor or isinstance(x, torch.Tensor):
            append((x.shape, x.stride(), x.dtype, x.device, ALIGNMENT_BY_LOW_BITS[x.data_ptr() & 15], x.is_neg(),
                    x.is_conj()))
        elif tx is int:
            append((int, x))
        elif tx is float:
            append(float)
        elif tx is list or tx is tuple:
            return None
        else:
            append(scalar_key(x))
    return tuple(sig)
