"""Matmul and attention: matmul, linear, sdpfa_fwd, sdpfa_bwd.

All four are OpKind.ATEN: they only ever run by ATen, each in an ExprEval segment, so ATen decides their output
layouts and meta inference must reproduce them exactly (meta_inference.md).

Layout contract (identical on CPU, CUDA and meta, so meta inference has one device-independent rule):
- matmul / linear: whatever ATen returns (contiguous on every device; ATen's meta kernels agree). The one hole,
  1-D@1-D (``aten::dot``, which lacks a C++ meta kernel upstream), has a meta override.
- sdpfa_fwd: ``out`` is dense in the stride order of ``query`` (dims sorted by decreasing stride, stride-0 dims
  keeping their place), which is what CUDA's flash kernel produces for a dense query; e.g. q, k, v made as
  [B,S,H,E] and transposed to [B,H,S,E] give out strides (S*H*E, E, H*E, 1). ``logsumexp`` is contiguous Float
  [N*,H,Q]; the philox seed is UInt64 [2] and the offset UInt64 []. Whatever kernel computed the values, the
  result is re-laid-out to this contract (a no-op in the common case), and the meta override returns exactly it.
  ATen's own meta of scaled_dot_product_attention runs the math path and returns contiguous BHSD, which is why
  the override is needed.
- sdpfa_bwd: dq, dk, dv follow ``torch.empty_like`` of q, k, v (what the flash backward allocates).

Kernels: on CUDA the flash kernels (``aten._scaled_dot_product_flash_attention[_backward]``) when they support the
inputs (fp16/bf16, head dim a multiple of 8 up to 256, E == Ev, unit last-dim strides, no bias/mask); on CPU the
forward uses ``aten._scaled_dot_product_flash_attention_for_cpu`` when it supports the inputs (E == Ev, no
dropout, no bias/mask). Everything else runs the math formulation below, computed in Float (Double for Double
inputs). ``bias`` (additive float) and ``mask`` (Bool, True = attend) are supported through the math path only.
The backward without the flash kernel is the analytic flash backward (it uses the given ``output`` and
``log_sumexp``); it cannot replay dropout, so it raises UnsupportedOpError for dropout_p > 0.
The seed is the CUDA flash kernel's philox state (torch's UInt64 [2] ``rng_state``: seed and offset) when it ran
with dropout, zeros otherwise; the offset output is always zero (torch's matching output is unused).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import torch

from ..errors import UnsupportedOpError
from ..ir.dtypes import DataType, is_floating, is_integral
from ..ir.nodes import IterDomain, Scalar, TensorView
from .common import FusionDtypeError, fail, fusion_of, new_tensor, require_tensor
from .registry import OpKind, OpResult, register

_MATMUL_DTYPES = (
    DataType.Double,
    DataType.Float,
    DataType.Half,
    DataType.BFloat16,
    DataType.ComplexFloat,
    DataType.ComplexDouble,
)
_ATTENTION_DTYPES = (DataType.Double, DataType.Float, DataType.Half, DataType.BFloat16)


# --------------------------------------------------------------------------------------------------------------
# definition-time shape helpers


def _static(d: IterDomain) -> Optional[int]:
    """The extent a dim has at run time when known now: 1 for a plain broadcast, None when symbolic."""
    if d.is_broadcast and not d.expanded:
        return 1
    return d.extent


def _materialized(d: IterDomain) -> IterDomain:
    """An input dim as it appears in a freshly computed output: an expanded broadcast (stride 0) becomes a real
    dim of its extent, because ATen writes every element of the result."""
    if d.is_broadcast and d.expanded:
        return IterDomain.iteration(d.extent)
    return IterDomain(d.extent, d.iter_type)


def _check_equal(op: str, dims: Sequence[IterDomain], what: str) -> None:
    """Dims that must have equal extents (no broadcasting): fail when two known extents differ."""
    known = {_static(d) for d in dims if _static(d) is not None}
    if len(known) > 1:
        fail(op, f"{what} must match, got extents {[_static(d) if _static(d) is not None else '?' for d in dims]}")


def _merge_equal(op: str, dims: Sequence[IterDomain], what: str) -> IterDomain:
    """Output dim for dims that must be equal: a broadcast only when every input dim is a plain broadcast."""
    _check_equal(op, dims, what)
    if any(d.is_broadcast and not d.expanded for d in dims):
        return IterDomain.broadcast()  # equal extents and one of them is 1
    known = [_static(d) for d in dims if _static(d) is not None]
    return IterDomain.iteration(known[0] if known else None)


def _merge_broadcast(op: str, dims: Sequence[Optional[IterDomain]], what: str) -> IterDomain:
    """Output dim of torch broadcasting (batch dims of matmul): plain broadcasts yield to any other dim."""
    present = [d for d in dims if d is not None]
    real = [d for d in present if not (d.is_broadcast and not d.expanded)]
    if not real:
        return IterDomain.broadcast()
    return _merge_equal(op, real, what)


def _check_broadcastable(
    op: str, arg: TensorView, argname: str, target: Sequence[IterDomain], target_desc: str
) -> None:
    """``arg`` must broadcast to ``target`` (right-aligned, torch rules) without changing the target's shape."""
    dims = arg.logical
    if len(dims) > len(target):
        fail(op, f"argument '{argname}' has rank {len(dims)}, more than the {len(target)} dims of {target_desc}")
    for i, d in enumerate(dims):
        t = target[len(target) - len(dims) + i]
        if d.is_broadcast and not d.expanded:
            continue
        a, b = _static(d), _static(t)
        if a is not None and b is not None and a != b:
            fail(op, f"argument '{argname}' dim {i} has extent {a}, which does not broadcast to {target_desc} "
                     f"(extent {b})")


def _float_tensor(op: str, x, argname: str, allowed=_MATMUL_DTYPES) -> TensorView:
    tv = require_tensor(op, x, argname)
    if tv.dtype not in allowed:
        names = ", ".join(d.name for d in allowed)
        fail(op, f"argument '{argname}' has {tv.dtype!r}; supported: {names}", FusionDtypeError)
    return tv


def _same_dtype(op: str, named: Sequence[tuple[str, TensorView]]) -> None:
    dtypes = {tv.dtype for _, tv in named}
    if len(dtypes) > 1:
        desc = ", ".join(f"'{n}' is {tv.dtype!r}" for n, tv in named)
        fail(op, f"operands must have the same dtype: {desc}", FusionDtypeError)


def _nonempty_rank(op: str, tv: TensorView, argname: str) -> None:
    if tv.ndim < 1:
        fail(op, f"argument '{argname}' must have rank >= 1, got a 0-dim tensor")


def _k_reduction(op: str, ka: IterDomain, kb: IterDomain, what: str) -> list[IterDomain]:
    """The contracted dim, kept as a trailing reduction dim as nvFuser does (none when K is broadcast in both)."""
    _check_equal(op, [ka, kb], what)
    if ka.is_broadcast and not ka.expanded and kb.is_broadcast and not kb.expanded:
        return []
    known = [_static(d) for d in (ka, kb) if _static(d) is not None and not (d.is_broadcast and not d.expanded)]
    return [IterDomain.reduction(known[0] if known else None)]


# --------------------------------------------------------------------------------------------------------------
# matmul


def _matmul_eval(node, arg1, arg2):
    return torch.matmul(arg1, arg2)


def _matmul_meta(node, arg1, arg2):
    # aten::dot has no C++ meta kernel (upstream #5491); the result of a vector dot product is a 0-dim tensor.
    if arg1.dim() == 1 and arg2.dim() == 1:
        if arg1.shape[0] != arg2.shape[0]:
            raise RuntimeError(f"1-D operands of different lengths {arg1.shape[0]} and {arg2.shape[0]}")
        return torch.empty((), dtype=arg1.dtype, device="meta")
    return torch.matmul(arg1, arg2)


@register("matmul", OpKind.ATEN, _matmul_eval, meta=_matmul_meta)
def matmul(arg1, arg2):
    """fd.ops.matmul(arg1, arg2): torch.matmul (any ranks >= 1; batch dims broadcast). Keeps the input dtype."""
    op = "matmul"
    a = _float_tensor(op, arg1, "arg1")
    b = _float_tensor(op, arg2, "arg2")
    _nonempty_rank(op, a, "arg1")
    _nonempty_rank(op, b, "arg2")
    _same_dtype(op, [("arg1", a), ("arg2", b)])
    la, lb = a.logical, b.logical
    ka = la[-1]
    kb = lb[-2] if len(lb) > 1 else lb[0]
    reduction = _k_reduction(op, ka, kb, "the contracted dims (last of 'arg1', second-to-last of 'arg2')")
    batch_a = la[:-2] if len(la) > 1 else ()
    batch_b = lb[:-2] if len(lb) > 1 else ()
    nb = max(len(batch_a), len(batch_b))
    pad_a = (None,) * (nb - len(batch_a)) + tuple(batch_a)
    pad_b = (None,) * (nb - len(batch_b)) + tuple(batch_b)
    out = [
        _merge_broadcast(op, [x, y], f"batch dim {i} of 'arg1' and 'arg2'")
        for i, (x, y) in enumerate(zip(pad_a, pad_b))
    ]
    if len(la) > 1:
        out.append(_materialized(la[-2]))  # M
    if len(lb) > 1:
        out.append(_materialized(lb[-1]))  # N
    fusion = fusion_of(op, a, b)
    return OpResult([new_tensor(fusion, out + reduction, a.dtype)], (a, b))


# --------------------------------------------------------------------------------------------------------------
# linear


def _linear_eval(node, arg1, arg2, bias=None):
    return torch.nn.functional.linear(arg1, arg2, bias)


@register("linear", OpKind.ATEN, _linear_eval)
def linear(arg1, arg2, bias=None):
    """fd.ops.linear(arg1, arg2, bias=None): arg1 @ arg2ᵀ + bias (F.linear). arg2 is [N, K] or [K] (then the
    result has no N dim); bias must broadcast to the result. Keeps the input dtype."""
    op = "linear"
    a = _float_tensor(op, arg1, "arg1")
    w = _float_tensor(op, arg2, "arg2")
    _nonempty_rank(op, a, "arg1")
    _nonempty_rank(op, w, "arg2")
    if w.ndim > 2:
        fail(op, f"argument 'arg2' (the weight) must be [N, K] or [K], got rank {w.ndim}")
    named = [("arg1", a), ("arg2", w)]
    b = None
    if bias is not None:
        b = _float_tensor(op, bias, "bias")
        named.append(("bias", b))
    _same_dtype(op, named)
    la, lw = a.logical, w.logical
    reduction = _k_reduction(op, la[-1], lw[-1], "the in-features dims (last of 'arg1' and of 'arg2')")
    out = [_materialized(d) for d in la[:-1]]
    if len(lw) == 2:
        out.append(_materialized(lw[0]))
    if b is not None:
        _check_broadcastable(op, b, "bias", out, "the result")
    fusion = fusion_of(op, a, w, b)
    kwargs = {} if b is None else {"bias": b}
    return OpResult([new_tensor(fusion, out + reduction, a.dtype)], (a, w), kwargs)


# --------------------------------------------------------------------------------------------------------------
# attention: layout rules shared by the real and the meta paths


def _dense_strides_in_order(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense tensor of ``shape`` whose dims are laid out outermost-first in ``order``."""
    strides = [0] * len(shape)
    running = 1
    for d in reversed(order):
        strides[d] = running
        running *= max(int(shape[d]), 1)
    return tuple(strides)


def _out_strides_following(query: torch.Tensor, out_shape: Sequence[int]) -> tuple[int, ...]:
    """sdpfa_fwd's output layout: dense, in query's stride order (stride-0 dims keep their logical place)."""
    from ..ir.tensor_layout import allocation_order_from_strides

    order = allocation_order_from_strides(list(query.shape), list(query.stride()))
    return _dense_strides_in_order(out_shape, order)


def _with_strides(t: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """``t`` laid out with exactly ``strides`` (a copy only when memory order differs)."""
    strides = tuple(strides)
    if t.stride() == strides:
        return t
    if all(s == r or n <= 1 for s, r, n in zip(t.stride(), strides, t.shape)):
        # Only the strides of size-1 dims differ: they address nothing, so a restrided view is the same data.
        return t.as_strided(t.shape, strides, t.storage_offset())
    out = torch.empty_strided(tuple(t.shape), strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _like(ref: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` in the layout ``torch.empty_like(ref)`` has (sdpfa_bwd's gradients). The layout is asked of a meta
    twin of ``ref``, so no memory is allocated just to learn it."""
    twin = torch.empty_strided(tuple(ref.shape), tuple(ref.stride()), dtype=ref.dtype, device="meta")
    return _with_strides(t, torch.empty_like(twin).stride())


def _philox_placeholders(device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.zeros((2,), dtype=torch.uint64, device=device),
        torch.zeros((), dtype=torch.uint64, device=device),
    )


def _check_runtime_qkv(query, key, value) -> None:
    """Run-time check of the extents the definition could leave symbolic (also runs on meta tensors)."""
    if not (query.dim() == key.dim() == value.dim()):
        raise RuntimeError(f"query, key and value ranks differ: {query.dim()}, {key.dim()}, {value.dim()}")
    if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
        raise RuntimeError(
            f"batch and head dims of query {list(query.shape)}, key {list(key.shape)} "
            f"and value {list(value.shape)} differ"
        )
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"query head dim {query.shape[-1]} != key head dim {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"key length {key.shape[-2]} != value length {value.shape[-2]}")


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _default_scale(query: torch.Tensor, scale) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


def _flatten_batch(t: torch.Tensor, keep: int) -> torch.Tensor:
    """Flash kernels take exactly one batch dim: merge the leading dims, keeping the last ``keep``."""
    return t.reshape(-1, *t.shape[t.dim() - keep :])


def _flash_usable(query, key, value, *, has_bias: bool, dropout_p: float, is_causal: bool, extra=()) -> bool:
    """Whether the fused flash kernel of the inputs' device supports them (else the math path runs)."""
    if has_bias or query.shape[-1] != value.shape[-1]:
        return False
    tensors = (query, key, value, *extra)
    if any(t.numel() == 0 for t in tensors):
        return False
    # Both kernels assume unit-stride head dims (the CPU one silently returns garbage otherwise; eager SDPA
    # copies such inputs first).
    if any(t.stride(-1) != 1 for t in tensors):
        return False
    dev = query.device
    if dev.type == "cuda":
        if query.dtype not in (torch.float16, torch.bfloat16):
            return False
        e = query.shape[-1]
        if e % 8 != 0 or e > 256:
            return False
        # The CUDA flash kernel aligns a non-square causal mask bottom-right; torch's (and our) semantics are
        # top-left, so such calls take the math path.
        if is_causal and query.shape[-2] != key.shape[-2]:
            return False
        return torch.cuda.get_device_capability(dev) >= (8, 0)
    if dev.type == "cpu":
        # The CPU kernel supports float types and a top-left causal mask, but no dropout.
        return dropout_p == 0.0 and query.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    return False


def _scores(query, key, scale, is_causal, bias, mask):
    """Scaled, biased, masked attention scores in the compute dtype."""
    cdt = _compute_dtype(query)
    s = torch.matmul(query.to(cdt), key.to(cdt).transpose(-1, -2)) * scale
    if is_causal:
        q_len, k_len = s.shape[-2], s.shape[-1]
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=s.device).tril()  # top-left aligned, as torch
        s = s.masked_fill(~keep, float("-inf"))
    if bias is not None:
        s = s + bias.to(cdt)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _probs(s, lse):
    # Rows with every score masked have lse = -inf: give them zero probabilities (and a zero output) instead of
    # NaN, as the fused kernels do.
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - safe.unsqueeze(-1))


def _math_fwd(query, key, value, scale, dropout_p, is_causal, bias, mask):
    s = _scores(query, key, scale, is_causal, bias, mask)
    lse = torch.logsumexp(s, dim=-1)
    p = _probs(s, lse)
    if dropout_p > 0.0:
        keep = torch.rand(p.shape, device=p.device) >= dropout_p
        p = p * keep / (1.0 - dropout_p)
    out = torch.matmul(p, value.to(p.dtype))
    return out.to(query.dtype), lse.to(torch.float32)


def _flash_fwd(query, key, value, scale, dropout_p, is_causal):
    """The device's flash kernel on 4-D views; returns (out, lse, seed, offset) with the batch dims restored."""
    batch = query.shape[:-3]
    q4, k4, v4 = (_flatten_batch(t, 3) for t in (query, key, value))
    seed, offset = _philox_placeholders(query.device)
    if query.device.type == "cuda":
        r = torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, dropout_p, is_causal, False, scale=scale)
        out4, lse4 = r[0], r[1]
        if dropout_p > 0.0:
            seed, offset = _philox_state(r[6], r[7])
    else:
        out4, lse4 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, is_causal, scale=scale
        )
    out = out4.reshape(*batch, *out4.shape[1:])
    lse = lse4.to(torch.float32).reshape(*batch, *lse4.shape[1:])
    return out, lse, seed, offset


def _philox_state(rng_state, unused):
    # torch >= 2.7 returns the philox (seed, offset) pair as one UInt64 [2] tensor plus an unused UInt64 [];
    # that is the form nvFuser's sdpfa_fwd outputs and sdpfa_bwd consumes. The unused tensor is uninitialized
    # memory (the backward ignores it), so a zero takes its place to keep outputs deterministic.
    if isinstance(rng_state, torch.Tensor) and rng_state.dtype == torch.uint64 and tuple(rng_state.shape) == (2,):
        return rng_state, torch.zeros((), dtype=torch.uint64, device=rng_state.device)
    raise UnsupportedOpError(
        "fd.ops.sdpfa_fwd: this torch's flash kernel returns its dropout RNG state in an older form "
        f"({getattr(rng_state, 'dtype', type(rng_state))}); dropout needs torch >= 2.7"
    )


def _scalar_args(query, dropout_p, is_causal, scale):
    return (0.0 if dropout_p is None else float(dropout_p)), bool(is_causal), _default_scale(query, scale)


# --------------------------------------------------------------------------------------------------------------
# sdpfa_fwd


def _sdpa_fwd_eval(node, query, key, value, bias=None, mask=None, dropout_p=None, is_causal=None, scale=None):
    _check_runtime_qkv(query, key, value)
    dropout_p, is_causal, scale = _scalar_args(query, dropout_p, is_causal, scale)
    has_bias = bias is not None or mask is not None
    if _flash_usable(query, key, value, has_bias=has_bias, dropout_p=dropout_p, is_causal=is_causal):
        out, lse, seed, offset = _flash_fwd(query, key, value, scale, dropout_p, is_causal)
    else:
        out, lse = _math_fwd(query, key, value, scale, dropout_p, is_causal, bias, mask)
        seed, offset = _philox_placeholders(query.device)
    out = _with_strides(out, _out_strides_following(query, out.shape))
    # Exactly the contiguous strides (``.contiguous()`` keeps odd strides on size-1 dims, which meta would not).
    lse = _with_strides(lse, _dense_strides_in_order(lse.shape, range(lse.dim())))
    return out, lse, seed, offset


def _sdpa_fwd_meta(node, query, key, value, bias=None, mask=None, dropout_p=None, is_causal=None, scale=None):
    _check_runtime_qkv(query, key, value)
    out_shape = (*query.shape[:-1], value.shape[-1])
    out = torch.empty_strided(out_shape, _out_strides_following(query, out_shape), dtype=query.dtype, device="meta")
    lse = torch.empty(tuple(query.shape[:-1]), dtype=torch.float32, device="meta")
    seed = torch.empty((2,), dtype=torch.uint64, device="meta")
    offset = torch.empty((), dtype=torch.uint64, device="meta")
    return out, lse, seed, offset


def _check_real_scalar(op: str, x, argname: str) -> None:
    """dropout_p / scale: a Python real number or a real-valued Scalar."""
    if x is None:
        return
    if isinstance(x, Scalar):
        if not (is_floating(x.dtype) or is_integral(x.dtype)):
            fail(op, f"argument '{argname}' must be a real-valued scalar, got a {x.dtype!r} scalar", FusionDtypeError)
        return
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        fail(op, f"argument '{argname}' must be a real number or a scalar Val, got {x!r}", FusionDtypeError)


def _check_bool_scalar(op: str, x, argname: str) -> None:
    if x is None or isinstance(x, bool):
        return
    if isinstance(x, Scalar) and x.dtype is DataType.Bool:
        return
    fail(op, f"argument '{argname}' must be a bool or a Bool scalar, got {x!r}", FusionDtypeError)


def _check_dropout(op: str, dropout_p) -> None:
    _check_real_scalar(op, dropout_p, "dropout_p")
    value = dropout_p.value if isinstance(dropout_p, Scalar) else dropout_p
    if value is not None and not 0.0 <= float(value) < 1.0:
        fail(op, f"argument 'dropout_p'={value} must be in [0, 1)")


def _scalar_kwargs(**kw) -> dict:
    """The canonical call omits arguments left at their default (None)."""
    return {k: v for k, v in kw.items() if v is not None}


def _attention_operands(op: str, named: Sequence[tuple[str, object]]) -> list[TensorView]:
    tvs = [_float_tensor(op, x, n, _ATTENTION_DTYPES) for n, x in named]
    _same_dtype(op, list(zip([n for n, _ in named], tvs)))
    ranks = [tv.ndim for tv in tvs]
    if len(set(ranks)) != 1 or ranks[0] < 4:
        desc = ", ".join(f"'{n}' has rank {r}" for (n, _), r in zip(named, ranks))
        fail(op, f"query, key and value must have the same rank >= 4 ([N*, H, seq, head_dim]); {desc}")
    return tvs


def _attention_batch(op: str, lq: Sequence[IterDomain], lk: Sequence[IterDomain],
                     lv: Sequence[IterDomain]) -> list[IterDomain]:
    """The batch/head dims that query, key and value share (merged), after checking that query and key agree in
    the head dim E and key and value in the sequence length K."""
    batch = [
        _merge_equal(op, [lq[i], lk[i], lv[i]], f"dim {i} (batch/head) of query, key and value")
        for i in range(len(lq) - 2)
    ]
    _check_equal(op, [lq[-1], lk[-1]], "the head dims (E) of query and key")
    _check_equal(op, [lk[-2], lv[-2]], "the sequence lengths (K) of key and value")
    return batch


def _alloc_following(tv: TensorView) -> Optional[list[int]]:
    """An output TV's allocation order copying ``tv``'s (same logical rank), as nvFuser's allocation-order
    inference does for attention outputs. Used when meta inference is disabled."""
    so = tv.stride_order()
    return sorted(range(len(so)), key=lambda d: -so[d])


@register("sdpfa_fwd", OpKind.ATEN, _sdpa_fwd_eval, meta=_sdpa_fwd_meta)
def sdpfa_fwd(query, key, value, bias=None, mask=None, dropout_p=None, is_causal=None, scale=None):
    """fd.ops.sdpfa_fwd(query [N*,H,Q,E], key [N*,H,K,E], value [N*,H,K,Ev], bias=None, mask=None, dropout_p=None,
    is_causal=None, scale=None) -> (out [N*,H,Q,Ev] laid out like query, logsumexp Float [N*,H,Q],
    philox_seed UInt64 [2], philox_offset UInt64 []). The default scale is 1/sqrt(E)."""
    op = "sdpfa_fwd"
    q, k, v = _attention_operands(op, [("query", query), ("key", key), ("value", value)])
    lq, lk, lv = q.logical, k.logical, v.logical
    batch = _attention_batch(op, lq, lk, lv)
    scores = batch + [_materialized(lq[-2]), _materialized(lk[-2])]
    if bias is not None:
        b = _float_tensor(op, bias, "bias", _ATTENTION_DTYPES)
        _check_broadcastable(op, b, "bias", scores, "the attention scores [N*, H, Q, K]")
    if mask is not None:
        m = require_tensor(op, mask, "mask")
        if m.dtype is not DataType.Bool:
            fail(op, f"argument 'mask' must be Bool (True = attend), got {m.dtype!r}", FusionDtypeError)
        _check_broadcastable(op, m, "mask", scores, "the attention scores [N*, H, Q, K]")
    _check_dropout(op, dropout_p)
    _check_bool_scalar(op, is_causal, "is_causal")
    _check_real_scalar(op, scale, "scale")

    fusion = fusion_of(op, q, k, v, bias, mask, dropout_p, is_causal, scale)
    out_dom = batch + [_materialized(lq[-2]), _materialized(lv[-1])]
    out = new_tensor(fusion, out_dom, q.dtype, alloc_order=_alloc_following(q))
    lse = new_tensor(fusion, batch + [_materialized(lq[-2])], DataType.Float)
    seed = new_tensor(fusion, [IterDomain.iteration(2)], DataType.UInt64)
    offset = new_tensor(fusion, [], DataType.UInt64)
    kwargs = _scalar_kwargs(bias=bias, mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    return OpResult([out, lse, seed, offset], (q, k, v), kwargs)


# --------------------------------------------------------------------------------------------------------------
# sdpfa_bwd


def _math_bwd(grad_output, query, key, value, output, log_sumexp, scale, is_causal):
    """The flash backward in the compute dtype: P from the saved logsumexp, dS = P * (dP - rowsum(dO * O))."""
    cdt = _compute_dtype(query)
    do, q, k, v, o = (t.to(cdt) for t in (grad_output, query, key, value, output))
    s = _scores(q, k, scale, is_causal, None, None)
    p = _probs(s, log_sumexp.to(cdt))
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, v.transpose(-1, -2))
    ds = p * (dp - (do * o).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    return dq, dk, dv


def _flash_bwd(grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal, seed, offset, scale):
    do4, q4, k4, v4, o4 = (_flatten_batch(t, 3) for t in (grad_output, query, key, value, output))
    lse3 = _flatten_batch(log_sumexp, 2).contiguous()
    # cum_seq_q/k are undefined for dense (non-nested) inputs, as in the forward's outputs.
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do4, q4, k4, v4, o4, lse3, None, None, q4.shape[2], k4.shape[2], dropout_p, is_causal, seed, offset, scale=scale
    )
    return tuple(g.reshape(t.shape) for g, t in zip((dq, dk, dv), (query, key, value)))


def _sdpa_bwd_eval(
    node, grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal, philox_seed, philox_offset,
    scale=None
):
    _check_runtime_qkv(query, key, value)
    dropout_p, is_causal, scale = _scalar_args(query, dropout_p, is_causal, scale)
    usable = query.device.type == "cuda" and _flash_usable(
        query, key, value, has_bias=False, dropout_p=dropout_p, is_causal=is_causal, extra=(grad_output, output)
    )
    if usable:
        grads = _flash_bwd(
            grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal, philox_seed, philox_offset, scale
        )
    else:
        if dropout_p > 0.0:
            raise UnsupportedOpError(
                "fd.ops.sdpfa_bwd: dropout_p > 0 needs the CUDA flash kernel (fp16/bf16, head dim a multiple of 8 "
                "up to 256) to replay the forward's dropout from the philox state; these inputs take the math path"
            )
        grads = _math_bwd(grad_output, query, key, value, output, log_sumexp, scale, is_causal)
    return tuple(_like(ref, g.to(ref.dtype)) for ref, g in zip((query, key, value), grads))


def _sdpa_bwd_meta(
    node, grad_output, query, key, value, output, log_sumexp, dropout_p, is_causal, philox_seed, philox_offset,
    scale=None
):
    _check_runtime_qkv(query, key, value)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


@register("sdpfa_bwd", OpKind.ATEN, _sdpa_bwd_eval, meta=_sdpa_bwd_meta)
def sdpfa_bwd(
    grad_output, query, key, value, output, logsumexp, dropout_p, is_causal, philox_seed, philox_offset, scale=None
):
    """fd.ops.sdpfa_bwd(grad_output, query, key, value, output, logsumexp, dropout_p, is_causal, philox_seed,
    philox_offset, scale=None) -> (grad_query, grad_key, grad_value), laid out like query, key, value.

    ``logsumexp`` is nvFuser's current keyword (it was ``log_sumexp`` before)."""
    op = "sdpfa_bwd"
    do, q, k, v, o = _attention_operands(
        op, [("grad_output", grad_output), ("query", query), ("key", key), ("value", value), ("output", output)]
    )
    lq, lk, lv = q.logical, k.logical, v.logical
    batch = _attention_batch(op, lq, lk, lv)
    out_dims = batch + [lq[-2], lv[-1]]
    for name, tv in (("grad_output", do), ("output", o)):
        for i, (d, t) in enumerate(zip(tv.logical, out_dims)):
            _check_equal(op, [d, t], f"dim {i} of '{name}' and of the attention output [N*, H, Q, Ev]")
    lse = _float_tensor(op, logsumexp, "logsumexp", (DataType.Float,))
    if lse.ndim != len(lq) - 1:
        fail(op, f"argument 'logsumexp' must have rank {len(lq) - 1} ([N*, H, Q]), got rank {lse.ndim}")
    for i, (d, t) in enumerate(zip(lse.logical, batch + [lq[-2]])):
        _check_equal(op, [d, t], f"dim {i} of 'logsumexp' and of [N*, H, Q]")
    seed = require_tensor(op, philox_seed, "philox_seed")
    offset = require_tensor(op, philox_offset, "philox_offset")
    _check_dropout(op, dropout_p)
    _check_bool_scalar(op, is_causal, "is_causal")
    _check_real_scalar(op, scale, "scale")

    fusion = fusion_of(op, do, q, k, v, o, lse, seed, offset, dropout_p, is_causal, scale)
    grads = [
        new_tensor(fusion, [_materialized(d) for d in tv.logical], tv.dtype, alloc_order=_alloc_following(tv))
        for tv in (q, k, v)
    ]
    args = (do, q, k, v, o, lse, dropout_p, is_causal, seed, offset)
    return OpResult(grads, args, _scalar_kwargs(scale=scale))
