"""matmul, linear, sdpfa_fwd and sdpfa_bwd: eager parity (values, shapes, dtypes, strides) over dtypes and
non-contiguous operands, the attention layout contract, and every definition-time error.

References are eager PyTorch written here: torch.matmul / F.linear, and for attention the math formulation
(softmax(q kᵀ · scale + bias) v) with torch.autograd for the gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import DEVICE, check_fusion, expanded, make, sliced, transposed
from pyfuser import (
    DataType,
    FusionDefinition,
    FusionDefinitionError,
    FusionDtypeError,
    UnsupportedOpError,
)

ON_CUDA = DEVICE.type == "cuda"
REDUCED = (torch.bfloat16, torch.float16)


def tol(dtype):
    """(atol, rtol) for comparing with a reference computed in Float."""
    if dtype in REDUCED:
        return 2e-2, 2e-2
    if dtype == torch.float64:
        return 1e-10, 1e-10
    return 2e-5, 2e-5


def with_stride_order(shape, stride_order, dtype=torch.float32):
    """A dense tensor of ``shape`` laid out as nvFuser's ``stride_order`` says (entry i = rank of dim i's stride,
    0 the fastest), together with the matching define_tensor call."""
    rank = len(shape)
    alloc = sorted(range(rank), key=lambda d: -stride_order[d])  # outermost first
    base = make([shape[d] for d in alloc], dtype)
    t = base.permute(*[alloc.index(d) for d in range(rank)])
    assert tuple(t.shape) == tuple(shape)

    def define(fd, dt):
        return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=dt, stride_order=list(stride_order))

    return t, define


def inputs_fusion(op, *extra_args, **extra_kwargs):
    """fn(fd) for check_fusion: ``op`` applied to from_pytorch inputs; every output is added."""

    def build(inputs):
        def fn(fd):
            vals = [fd.from_pytorch(t) for t in inputs]
            out = getattr(fd.ops, op)(*vals, *extra_args, **extra_kwargs)
            for o in out if isinstance(out, tuple) else (out,):
                fd.add_output(o)

        return fn

    return build


# ==============================================================================================================
# matmul

MATMUL_SHAPES = [
    ((4,), (4,)),
    ((3, 4), (4,)),
    ((4,), (4, 5)),
    ((3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (3, 4, 5)),
    ((1, 4), (4, 1)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_ranks(sa, sb):
    a, b = make(sa), make(sb)
    outs = check_fusion(inputs_fusion("matmul")([a, b]), [a, b], torch.matmul, expected_segments=["ExprEval"])
    assert outs[0].shape == torch.matmul(a, b).shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64])
def test_matmul_dtypes(dtype):
    a, b = make((2, 3, 8), dtype), make((8, 5), dtype)
    atol, rtol = tol(dtype)
    outs = check_fusion(inputs_fusion("matmul")([a, b]), [a, b], torch.matmul, atol=atol, rtol=rtol)
    assert outs[0].dtype == dtype  # matmul keeps the input dtype


def test_matmul_dot_bf16_keeps_dtype():
    a, b = make((16,), torch.bfloat16), make((16,), torch.bfloat16)
    outs = check_fusion(inputs_fusion("matmul")([a, b]), [a, b], torch.matmul, atol=2e-2, rtol=2e-2)
    assert outs[0].dim() == 0 and outs[0].dtype == torch.bfloat16


MATMUL_NONCONTIG = {
    "a_transposed": lambda: (transposed((3, 4)), make((4, 5))),
    "b_transposed": lambda: (make((3, 4)), transposed((4, 5))),
    "both_transposed_batched": lambda: (transposed((2, 3, 4)), transposed((2, 4, 5))),
    "a_sliced": lambda: (sliced((3, 4)), make((4, 5))),
    "b_sliced_batched": lambda: (make((2, 3, 4)), sliced((2, 4, 5))),
    "a_expanded_batch": lambda: (expanded((2, 3, 4), 0), make((4, 5))),
    "b_expanded_batch": lambda: (make((2, 3, 4)), expanded((2, 4, 5), 0)),
    "batch_permuted": lambda: (make((3, 2, 4)).permute(1, 0, 2), make((2, 4, 5))),
    "vector_strided": lambda: (make((8,))[::2], make((4, 5))),
}


@pytest.mark.parametrize("name", sorted(MATMUL_NONCONTIG))
def test_matmul_noncontiguous(name):
    a, b = MATMUL_NONCONTIG[name]()
    check_fusion(inputs_fusion("matmul")([a, b]), [a, b], torch.matmul, expected_segments=["ExprEval"])


def test_matmul_stride_order_input():
    a, define_a = with_stride_order((2, 3, 4), [1, 0, 2])  # allocation [G, K, M]
    b = make((2, 4, 5))

    def fn(fd):
        ta = define_a(fd, DataType.Float)
        tb = fd.from_pytorch(b)
        fd.add_output(fd.ops.matmul(ta, tb))

    check_fusion(fn, [a, b], torch.matmul)


def test_matmul_feeds_pointwise():
    """The matmul result crosses a segment boundary into a kernel segment with its inferred layout."""
    a, b = transposed((2, 3, 4)), make((4, 5))

    def fn(fd):
        ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.relu(fd.ops.matmul(ta, tb)))

    check_fusion(fn, [a, b], lambda a, b: torch.relu(torch.matmul(a, b)), expected_segments=["ExprEval", "PointWise"])


def test_matmul_symbolic_k_mismatch_fails_at_run_time():
    a, b = make((3, 4)), make((5, 6))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.matmul(fd.from_pytorch(a), fd.from_pytorch(b)))
    with pytest.raises(RuntimeError, match="matmul"):
        fd.execute([a, b])


# ==============================================================================================================
# linear

LINEAR_SHAPES = [
    ((3, 4), (5, 4), None),
    ((3, 4), (5, 4), (5,)),
    ((2, 3, 4), (5, 4), (5,)),
    ((2, 3, 4), (5, 4), None),
    ((4,), (5, 4), (5,)),
    ((3, 4), (4,), None),
    ((4,), (4,), None),
]


@pytest.mark.parametrize("sa,sw,sbias", LINEAR_SHAPES, ids=[f"{a}x{w}+{b}" for a, w, b in LINEAR_SHAPES])
def test_linear_ranks(sa, sw, sbias):
    inputs = [make(sa), make(sw)] + ([make(sbias)] if sbias is not None else [])
    check_fusion(
        inputs_fusion("linear")(inputs), inputs, torch.nn.functional.linear, expected_segments=["ExprEval"]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_linear_dtypes(dtype):
    inputs = [make((2, 3, 8), dtype), make((5, 8), dtype), make((5,), dtype)]
    atol, rtol = tol(dtype)
    outs = check_fusion(inputs_fusion("linear")(inputs), inputs, torch.nn.functional.linear, atol=atol, rtol=rtol)
    assert outs[0].dtype == dtype


LINEAR_NONCONTIG = {
    "weight_transposed": lambda: [make((3, 4)), transposed((5, 4)), make((5,))],
    "input_transposed": lambda: [transposed((3, 4)), make((5, 4)), make((5,))],
    "input_3d_transposed": lambda: [transposed((2, 3, 4)), make((5, 4)), make((5,))],
    "input_sliced": lambda: [sliced((2, 3, 4)), make((5, 4)), make((5,))],
    "weight_sliced": lambda: [make((3, 4)), sliced((5, 4))],
    "input_expanded_batch": lambda: [expanded((2, 3, 4), 0), make((5, 4)), make((5,))],
    "bias_strided": lambda: [make((3, 4)), make((5, 4)), make((10,))[::2]],
}


@pytest.mark.parametrize("name", sorted(LINEAR_NONCONTIG))
def test_linear_noncontiguous(name):
    inputs = LINEAR_NONCONTIG[name]()
    check_fusion(inputs_fusion("linear")(inputs), inputs, torch.nn.functional.linear)


def test_linear_stride_order_weight():
    w, define_w = with_stride_order((5, 4), [0, 1])  # column-major weight
    a, bias = make((2, 3, 4)), make((5,))

    def fn(fd):
        ta = fd.from_pytorch(a)
        tw = define_w(fd, DataType.Float)
        tb = fd.from_pytorch(bias)
        fd.add_output(fd.ops.linear(ta, tw, bias=tb))

    check_fusion(fn, [a, w, bias], torch.nn.functional.linear)


def test_linear_repr_omits_absent_bias():
    a, w = make((3, 4)), make((5, 4))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.linear(fd.from_pytorch(a), fd.from_pytorch(w)))
    assert "fd.ops.linear(tv0, tv1)" in repr(fd)


# ==============================================================================================================
# attention: eager reference


def ref_attention(q, k, v, *, scale=None, is_causal=False, bias=None, mask=None):
    """(out, logsumexp) by the math formulation, in Float (Double for Double inputs)."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q.to(cdt), k.to(cdt).transpose(-2, -1)) * scale
    if is_causal:
        lq, lk = scores.shape[-2:]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if bias is not None:
        scores = scores + bias.to(cdt)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.to(cdt)).to(q.dtype)
    return out, torch.logsumexp(scores, dim=-1).to(torch.float32)


def expected_out_strides(q, out_shape):
    """The contract: out is dense in q's stride order (stride-0 dims keep their logical position)."""
    rank = q.dim()
    movable = sorted((d for d in range(rank) if q.stride(d) != 0), key=lambda d: -q.stride(d))
    it = iter(movable)
    order = [d if q.stride(d) == 0 else next(it) for d in range(rank)]
    strides, running = [0] * rank, 1
    for d in reversed(order):
        strides[d] = running
        running *= out_shape[d]
    return tuple(strides)


def laid_out(t, strides):
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def ref_sdpa_fwd(**kw):
    def reference(q, k, v, *rest):
        names = [n for n in ("bias", "mask") if n in kw.get("tensor_args", ())]
        extra = dict(zip(names, rest))
        opts = {n: kw[n] for n in ("scale", "is_causal") if n in kw}
        out, lse = ref_attention(q, k, v, **opts, **extra)
        return [laid_out(out, expected_out_strides(q, out.shape)), lse]

    return reference


def sdpa_fusion(inputs, tensor_args=(), with_philox=False, **kwargs):
    def fn(fd):
        q, k, v, *rest = [fd.from_pytorch(t) for t in inputs]
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, **dict(zip(tensor_args, rest)), **kwargs)
        fd.add_output(out)
        fd.add_output(lse)
        if with_philox:
            fd.add_output(seed)
            fd.add_output(offset)

    return fn


def qkv(q_shape, kv_len, ev=None, dtype=torch.float32, maker=make):
    *batch, s, e = q_shape
    ev = e if ev is None else ev
    return [maker(tuple(q_shape), dtype), maker((*batch, kv_len, e), dtype), maker((*batch, kv_len, ev), dtype)]


def bshd(shape, dtype=torch.float32):
    """A [B,H,S,E] tensor made as contiguous [B,S,H,E] and transposed."""
    b, h, s, e = shape
    return make((b, s, h, e), dtype).transpose(1, 2)


# ==============================================================================================================
# sdpfa_fwd

SDPA_FWD_CASES = {
    "basic": dict(q=(2, 3, 5, 8), kv=7),
    "value_head_dim_differs": dict(q=(2, 3, 5, 8), kv=7, ev=4),
    "causal_square": dict(q=(2, 2, 6, 8), kv=6, is_causal=True),
    "causal_non_square": dict(q=(1, 2, 4, 8), kv=6, is_causal=True),
    "scale": dict(q=(2, 3, 5, 8), kv=7, scale=0.3),
    "five_d": dict(q=(2, 2, 3, 5, 8), kv=4),
    "single_query": dict(q=(2, 3, 1, 8), kv=7),
}


@pytest.mark.parametrize("name", sorted(SDPA_FWD_CASES))
def test_sdpfa_fwd_cases(name):
    c = dict(SDPA_FWD_CASES[name])
    inputs = qkv(c.pop("q"), c.pop("kv"), c.pop("ev", None))
    check_fusion(
        sdpa_fusion(inputs, **c), inputs, ref_sdpa_fwd(**c), atol=2e-5, rtol=2e-5, expected_segments=["ExprEval"]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [8, 16])
def test_sdpfa_fwd_dtypes(dtype, head_dim):
    inputs = qkv((2, 2, 6, head_dim), 6, dtype=dtype)
    atol, rtol = tol(dtype)
    outs = check_fusion(sdpa_fusion(inputs, is_causal=True), inputs, ref_sdpa_fwd(is_causal=True), atol=atol, rtol=rtol)
    assert outs[0].dtype == dtype and outs[1].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpfa_fwd_bshd_transposed_follows_q(dtype):
    b, s, h, e = 2, 5, 3, 8
    q, k, v = bshd((b, h, s, e), dtype), bshd((b, h, 7, e), dtype), bshd((b, h, 7, e), dtype)
    atol, rtol = tol(dtype)
    outs = check_fusion(sdpa_fusion([q, k, v]), [q, k, v], ref_sdpa_fwd(), atol=atol, rtol=rtol)
    assert outs[0].stride() == (s * h * e, e, h * e, 1)
    assert outs[1].shape == (b, h, s) and outs[1].is_contiguous()


SDPA_NONCONTIG = {
    "q_head_dim_transposed": lambda: [transposed((2, 3, 5, 8)), make((2, 3, 7, 8)), make((2, 3, 7, 8))],
    "all_column_major": lambda: [make(s[::-1]).permute(3, 2, 1, 0) for s in ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8))],
    "sliced": lambda: [sliced((2, 3, 5, 8)), sliced((2, 3, 7, 8)), sliced((2, 3, 7, 8))],
    "kv_expanded_batch": lambda: [make((2, 3, 5, 8)), expanded((2, 3, 7, 8), 0), expanded((2, 3, 7, 8), 0)],
    "q_expanded_heads": lambda: [expanded((2, 3, 5, 8), 1), make((2, 3, 7, 8)), make((2, 3, 7, 8))],
    "heads_outermost": lambda: [make((3, 2, 5, 8)).transpose(0, 1), make((2, 3, 7, 8)), make((2, 3, 7, 8))],
}


@pytest.mark.parametrize("name", sorted(SDPA_NONCONTIG))
def test_sdpfa_fwd_noncontiguous(name):
    inputs = SDPA_NONCONTIG[name]()
    outs = check_fusion(sdpa_fusion(inputs), inputs, ref_sdpa_fwd(), atol=2e-5, rtol=2e-5)
    assert outs[0].stride() == expected_out_strides(inputs[0], outs[0].shape)


def test_sdpfa_fwd_stride_order_query():
    q, define_q = with_stride_order((2, 3, 5, 8), [3, 1, 2, 0])  # BSHD memory order
    k, v = make((2, 3, 7, 8)), make((2, 3, 7, 8))

    def fn(fd):
        tq = define_q(fd, DataType.Float)
        out, lse, _, _ = fd.ops.sdpfa_fwd(tq, fd.from_pytorch(k), fd.from_pytorch(v))
        fd.add_output(out)
        fd.add_output(lse)

    outs = check_fusion(fn, [q, k, v], ref_sdpa_fwd(), atol=2e-5, rtol=2e-5)
    assert outs[0].stride() == (5 * 3 * 8, 8, 3 * 8, 1)


def test_sdpfa_fwd_bias_and_mask():
    q, k, v = qkv((2, 3, 5, 8), 7)
    bias = make((5, 7))  # broadcast over batch and heads
    mask = make((2, 1, 5, 7), torch.bool)
    mask[..., 0] = True  # every row keeps at least one key
    inputs = [q, k, v, bias, mask]
    ta = ("bias", "mask")
    check_fusion(sdpa_fusion(inputs, ta), inputs, ref_sdpa_fwd(tensor_args=ta), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("which", ["bias", "mask"])
def test_sdpfa_fwd_bias_or_mask_bshd(which):
    q, k, v = bshd((2, 3, 5, 8)), bshd((2, 3, 6, 8)), bshd((2, 3, 6, 8))
    extra = make((5, 6)) if which == "bias" else make((1, 3, 5, 6), torch.bool).logical_or(torch.eye(5, 6, dtype=torch.bool, device=DEVICE))
    inputs = [q, k, v, extra]
    outs = check_fusion(sdpa_fusion(inputs, (which,), is_causal=True), inputs, ref_sdpa_fwd(tensor_args=(which,), is_causal=True), atol=2e-5, rtol=2e-5)
    assert outs[0].stride() == (5 * 3 * 8, 8, 3 * 8, 1)


def test_sdpfa_fwd_symbolic_scalars():
    q, k, v = qkv((2, 3, 5, 8), 7)

    def fn(fd):
        tq, tk, tv = (fd.from_pytorch(t) for t in (q, k, v))
        dropout = fd.define_scalar(None, dtype=DataType.Double)
        causal = fd.define_scalar(None, dtype=DataType.Bool)
        scale = fd.define_scalar(None, dtype=DataType.Double)
        out, lse, _, _ = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=dropout, is_causal=causal, scale=scale)
        fd.add_output(out)
        fd.add_output(lse)

    reference = ref_sdpa_fwd(is_causal=True, scale=0.25)
    check_fusion(fn, [q, k, v, 0.0, True, 0.25], lambda q, k, v, *_: reference(q, k, v), atol=2e-5, rtol=2e-5)


def test_sdpfa_fwd_philox_outputs_without_dropout():
    inputs = qkv((2, 3, 5, 8), 7)
    outs = check_fusion(
        sdpa_fusion(inputs, with_philox=True),
        inputs,
        lambda q, k, v: ref_sdpa_fwd()(q, k, v)
        + [torch.zeros(2, dtype=torch.uint64, device=DEVICE), torch.zeros((), dtype=torch.uint64, device=DEVICE)],
        atol=2e-5,
        rtol=2e-5,
    )
    assert outs[2].shape == (2,) and outs[3].shape == () and outs[2].dtype == outs[3].dtype == torch.uint64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpfa_fwd_dropout_shapes_only(dtype):
    """Dropout makes values random: check shapes, dtypes, strides and the inferred layouts only."""
    q, k, v = bshd((2, 3, 6, 16), dtype), bshd((2, 3, 6, 16), dtype), bshd((2, 3, 6, 16), dtype)
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.from_pytorch(t) for t in (q, k, v))
        outs_tv = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=fd.define_scalar(0.5), is_causal=True)
        for o in outs_tv:
            fd.add_output(o)
    out, lse, seed, offset = fd.execute([q, k, v], _enable_options=["check_layouts"])
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == q.stride()
    assert lse.shape == (2, 3, 6) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert seed.shape == (2,) and seed.dtype == torch.uint64 and offset.shape == () and offset.dtype == torch.uint64
    assert torch.isfinite(out.float()).all()


# ==============================================================================================================
# sdpfa_bwd


def ref_grads(q, k, v, grad, *, scale=None, is_causal=False):
    """(dq, dk, dv) by torch.autograd through the math formulation, laid out like empty_like(q/k/v)."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(cdt).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out, _ = ref_attention(*leaves, scale=scale, is_causal=is_causal)
        grads = torch.autograd.grad(out, leaves, grad.to(cdt))
    return [torch.empty_like(t).copy_(g) for t, g in zip((q, k, v), grads)]


def bwd_inputs(shape, kv_len, dtype=torch.float32, maker=make, **kw):
    q, k, v = qkv(shape, kv_len, dtype=dtype, maker=maker)
    grad = maker(tuple(shape), dtype)
    out, lse = ref_attention(q, k, v, **kw)
    seed = torch.zeros(2, dtype=torch.uint64, device=DEVICE)
    offset = torch.zeros((), dtype=torch.uint64, device=DEVICE)
    return [grad, q, k, v, laid_out(out, expected_out_strides(q, out.shape)), lse, seed, offset]


def bwd_fusion(inputs, dropout_p=0.0, is_causal=False, scale=None):
    def fn(fd):
        grad, q, k, v, out, lse, seed, offset = [fd.from_pytorch(t) for t in inputs]
        grads = fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, dropout_p, is_causal, seed, offset, scale)
        for g in grads:
            fd.add_output(g)

    return fn


SDPA_BWD_CASES = {
    "basic": dict(shape=(2, 3, 5, 8), kv=7),
    "causal": dict(shape=(2, 2, 6, 8), kv=6, is_causal=True),
    "causal_non_square": dict(shape=(1, 2, 4, 8), kv=6, is_causal=True),
    "scale": dict(shape=(2, 3, 5, 8), kv=7, scale=0.3),
    "five_d": dict(shape=(2, 2, 3, 5, 8), kv=4),
}


@pytest.mark.parametrize("name", sorted(SDPA_BWD_CASES))
def test_sdpfa_bwd_matches_autograd(name):
    c = dict(SDPA_BWD_CASES[name])
    shape, kv = c.pop("shape"), c.pop("kv")
    inputs = bwd_inputs(shape, kv, **c)
    check_fusion(
        bwd_fusion(inputs, is_causal=c.get("is_causal", False), scale=c.get("scale")),
        inputs,
        lambda grad, q, k, v, *_: ref_grads(q, k, v, grad, **c),
        atol=1e-4,
        rtol=1e-4,
        expected_segments=["ExprEval"],
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_sdpfa_bwd_dtypes(dtype):
    inputs = bwd_inputs((2, 2, 6, 16), 6, dtype, is_causal=True)
    # Double gradients still see the Float logsumexp (the op's contract), hence 1e-6.
    atol, rtol = (5e-2, 5e-2) if dtype in REDUCED else (1e-6, 1e-6)
    outs = check_fusion(
        bwd_fusion(inputs, is_causal=True),
        inputs,
        lambda grad, q, k, v, *_: ref_grads(q, k, v, grad, is_causal=True),
        atol=atol,
        rtol=rtol,
    )
    assert all(o.dtype == dtype for o in outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpfa_bwd_bshd_grads_follow_inputs(dtype):
    inputs = bwd_inputs((2, 3, 5, 16), 5, dtype, maker=bshd)
    atol, rtol = (5e-2, 5e-2) if dtype in REDUCED else (1e-4, 1e-4)
    outs = check_fusion(
        bwd_fusion(inputs), inputs, lambda grad, q, k, v, *_: ref_grads(q, k, v, grad), atol=atol, rtol=rtol
    )
    for g, t in zip(outs, inputs[1:4]):
        assert g.stride() == t.stride()


SDPA_BWD_NONCONTIG = {
    "column_major": lambda s: make(s[::-1]).permute(3, 2, 1, 0),
    "sliced": lambda s: sliced(s),
    "head_dim_transposed": lambda s: transposed(s),
}


@pytest.mark.parametrize("name", sorted(SDPA_BWD_NONCONTIG))
def test_sdpfa_bwd_noncontiguous(name):
    maker = lambda shape, dtype=torch.float32: SDPA_BWD_NONCONTIG[name](tuple(shape)).to(dtype)  # noqa: E731
    inputs = bwd_inputs((2, 3, 5, 8), 5, maker=maker)
    check_fusion(bwd_fusion(inputs), inputs, lambda grad, q, k, v, *_: ref_grads(q, k, v, grad), atol=1e-4, rtol=1e-4)


def test_sdpfa_fwd_then_bwd_matches_autograd():
    q, k, v = bshd((2, 3, 6, 8)), bshd((2, 3, 6, 8)), bshd((2, 3, 6, 8))
    grad = make((2, 3, 6, 8))

    def fn(fd):
        tq, tk, tv, tg = (fd.from_pytorch(t) for t in (q, k, v, grad))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=True)
        dq, dk, dv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, 0.0, True, seed, offset)
        for t in (out, dq, dk, dv):
            fd.add_output(t)

    def reference(q, k, v, grad):
        out, _ = ref_attention(q, k, v, is_causal=True)
        return [laid_out(out, expected_out_strides(q, out.shape))] + ref_grads(q, k, v, grad, is_causal=True)

    check_fusion(fn, [q, k, v, grad], reference, atol=1e-4, rtol=1e-4, expected_segments=["ExprEval"])


def test_sdpfa_bwd_dropout_needs_flash_kernel():
    """Without the CUDA flash kernel (float32 never has it) the forward's dropout cannot be replayed."""
    inputs = bwd_inputs((2, 3, 5, 8), 5)
    with FusionDefinition() as fd:
        bwd_fusion(inputs, dropout_p=0.2)(fd)
    with pytest.raises(UnsupportedOpError, match="sdpfa_bwd.*dropout_p"):
        fd.execute(inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash kernels and their philox state need CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpfa_flash_dropout_round_trip_cuda(dtype):
    """On CUDA the flash forward returns its philox state, and the backward replays the same dropout mask: the
    gradients are deterministic given the seed, and match autograd when dropout is 0."""
    q, k, v = bshd((2, 4, 64, 64), dtype), bshd((2, 4, 64, 64), dtype), bshd((2, 4, 64, 64), dtype)
    grad = make((2, 4, 64, 64), dtype)

    def run(p):
        with FusionDefinition() as fd:
            tq, tk, tv, tg = (fd.from_pytorch(t) for t in (q, k, v, grad))
            out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=p, is_causal=True)
            dq, dk, dv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, lse, p, True, seed, offset)
            for t in (out, lse, seed, offset, dq, dk, dv):
                fd.add_output(t)
        return fd.execute([q, k, v, grad], _enable_options=["check_layouts"])

    out, lse, seed, offset, dq, dk, dv = run(0.3)
    assert seed.dtype == torch.uint64 and seed.shape == (2,) and seed.device.type == "cuda"
    assert offset.dtype == torch.uint64 and offset.shape == ()
    assert out.stride() == q.stride() and dq.stride() == q.stride() and dk.stride() == k.stride()
    assert all(torch.isfinite(t.float()).all() for t in (out, dq, dk, dv))
    # out = P_drop @ v and dv = P_dropᵀ @ grad, so <grad, out> = <dv, v> exactly when the backward replays the
    # forward's dropout mask (another mask gives an unrelated value).
    lhs, rhs = (grad.double() * out.double()).sum(), (dv.double() * v.double()).sum()
    torch.testing.assert_close(lhs, rhs, atol=1.0, rtol=2e-2)
    out0, _, seed0, _, dq0, dk0, dv0 = run(0.0)
    assert bool((seed0.view(torch.int64) == 0).all())  # no dropout: placeholders
    for got, want in zip((dq0, dk0, dv0), ref_grads(q, k, v, grad, is_causal=True)):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


# ==============================================================================================================
# definition-time errors


def _defs(*shapes_dtypes):
    """Define tensors from (shape, DataType) pairs in a new FusionDefinition (shape entries as define_tensor's)."""
    fd = FusionDefinition()
    fd.__enter__()
    tvs = [fd.define_tensor(shape=list(s), contiguity=[None if x == 1 else True for x in s], dtype=dt) for s, dt in shapes_dtypes]
    return fd, tvs


@pytest.fixture
def fusion_scope():
    created = []

    def open_(*shapes_dtypes):
        fd, tvs = _defs(*shapes_dtypes)
        created.append(fd)
        return tvs

    yield open_
    for fd in reversed(created):
        fd.__exit__(None, None, None)


F, H, B = DataType.Float, DataType.Half, DataType.BFloat16

ERROR_CASES = {
    "matmul_0d": ("matmul", [((), F), ((4,), F)], {}, FusionDefinitionError, "'arg1' must have rank >= 1"),
    "matmul_0d_rhs": ("matmul", [((3, 4), F), ((), F)], {}, FusionDefinitionError, "'arg2' must have rank >= 1"),
    "matmul_dtype_mismatch": ("matmul", [((3, 4), F), ((4, 5), B)], {}, FusionDtypeError, "same dtype"),
    "matmul_int": ("matmul", [((3, 4), DataType.Int), ((4, 5), DataType.Int)], {}, FusionDtypeError, "'arg1' has DataType.Int"),
    "matmul_k_mismatch": ("matmul", [((3, 4), F), ((5, 6), F)], {}, FusionDefinitionError, "contracted dims"),
    "matmul_dot_k_mismatch": ("matmul", [((4,), F), ((5,), F)], {}, FusionDefinitionError, "contracted dims"),
    "matmul_batch_mismatch": ("matmul", [((2, 3, 4), F), ((5, 4, 6), F)], {}, FusionDefinitionError, "batch dim 0"),
    "linear_weight_rank": ("linear", [((3, 4), F), ((2, 5, 4), F)], {}, FusionDefinitionError, "'arg2' .* rank 3"),
    "linear_0d": ("linear", [((), F), ((5, 4), F)], {}, FusionDefinitionError, "'arg1' must have rank >= 1"),
    "linear_k_mismatch": ("linear", [((3, 4), F), ((5, 6), F)], {}, FusionDefinitionError, "in-features"),
    "linear_dtype_mismatch": ("linear", [((3, 4), H), ((5, 4), F)], {}, FusionDtypeError, "same dtype"),
    "linear_bias_dtype": ("linear", [((3, 4), F), ((5, 4), F), ((5,), B)], {}, FusionDtypeError, "'bias' is DataType.BFloat16"),
    "linear_bias_shape": ("linear", [((3, 4), F), ((5, 4), F), ((6,), F)], {}, FusionDefinitionError, "'bias' dim 0"),
    "linear_bias_rank": ("linear", [((3, 4), F), ((5, 4), F), ((2, 3, 5), F)], {}, FusionDefinitionError, "'bias' has rank 3"),
    "sdpa_rank3": ("sdpfa_fwd", [((3, 5, 8), F)] * 3, {}, FusionDefinitionError, "rank >= 4"),
    "sdpa_rank_mismatch": ("sdpfa_fwd", [((2, 3, 5, 8), F), ((2, 2, 3, 7, 8), F), ((2, 3, 7, 8), F)], {}, FusionDefinitionError, "'key' has rank 5"),
    "sdpa_head_dim": ("sdpfa_fwd", [((2, 3, 5, 8), F), ((2, 3, 7, 16), F), ((2, 3, 7, 8), F)], {}, FusionDefinitionError, "head dims"),
    "sdpa_kv_len": ("sdpfa_fwd", [((2, 3, 5, 8), F), ((2, 3, 7, 8), F), ((2, 3, 6, 8), F)], {}, FusionDefinitionError, "sequence lengths"),
    "sdpa_heads": ("sdpfa_fwd", [((2, 3, 5, 8), F), ((2, 4, 7, 8), F), ((2, 4, 7, 8), F)], {}, FusionDefinitionError, "dim 1"),
    "sdpa_dtype_mismatch": ("sdpfa_fwd", [((2, 3, 5, 8), H), ((2, 3, 7, 8), B), ((2, 3, 7, 8), B)], {}, FusionDtypeError, "same dtype"),
    "sdpa_int": ("sdpfa_fwd", [((2, 3, 5, 8), DataType.Int)] * 3, {}, FusionDtypeError, "'query' has DataType.Int"),
    "sdpa_dropout_range": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3, {"dropout_p": 1.5}, FusionDefinitionError, "dropout_p"),
    "sdpa_dropout_type": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3, {"dropout_p": "0.1"}, FusionDtypeError, "dropout_p"),
    "sdpa_causal_type": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3, {"is_causal": 1}, FusionDtypeError, "is_causal"),
    "sdpa_scale_type": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3, {"scale": True}, FusionDtypeError, "scale"),
    "sdpa_mask_dtype": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3 + [((5, 5), F)], {"tensor_kw": "mask"}, FusionDtypeError, "'mask' must be Bool"),
    "sdpa_mask_shape": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3 + [((4, 5), DataType.Bool)], {"tensor_kw": "mask"}, FusionDefinitionError, "'mask' dim 0"),
    "sdpa_bias_shape": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3 + [((3, 5, 6), F)], {"tensor_kw": "bias"}, FusionDefinitionError, "'bias' dim 2"),
    "sdpa_bias_rank": ("sdpfa_fwd", [((2, 3, 5, 8), F)] * 3 + [((2, 2, 3, 5, 5), F)], {"tensor_kw": "bias"}, FusionDefinitionError, "'bias' has rank 5"),
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_definition_errors(name, fusion_scope):
    op, specs, kwargs, exc, pattern = ERROR_CASES[name]
    kwargs = dict(kwargs)
    tvs = fusion_scope(*specs)
    tensor_kw = kwargs.pop("tensor_kw", None)
    if tensor_kw is not None:
        kwargs[tensor_kw] = tvs.pop()
    fn = getattr(FusionDefinition.ops, op)
    with pytest.raises(exc, match=f"fd.ops.{op}: .*{pattern}"):
        fn(*tvs, **kwargs)


def _bwd_specs(q=(2, 3, 5, 8), lse=(2, 3, 5), lse_dt=F, dt=F, grad_dt=None, k=None, v=None):
    return [(q, grad_dt or dt), (q, dt), (k or q, dt), (v or q, dt), (q, dt), (lse, lse_dt), ((2,), DataType.UInt64),
            ((), DataType.UInt64)]


BWD_ERRORS = {
    "lse_rank": (_bwd_specs(lse=(2, 3)), FusionDefinitionError, "'logsumexp' must have rank 3"),
    "lse_dtype": (_bwd_specs(lse_dt=B), FusionDtypeError, "'logsumexp' has DataType.BFloat16"),
    "lse_extent": (_bwd_specs(lse=(2, 3, 6)), FusionDefinitionError, "dim 2 of 'logsumexp'"),
    "grad_dtype": (_bwd_specs(dt=H, grad_dt=B), FusionDtypeError, "same dtype"),
    "rank3": (_bwd_specs(q=(3, 5, 8), lse=(3, 5)), FusionDefinitionError, "rank >= 4"),
    # The query/key/value dim checks sdpfa_fwd shares (ops/matmul.py, _attention_batch).
    "head_dim": (_bwd_specs(k=(2, 3, 5, 16)), FusionDefinitionError, "head dims"),
    "kv_len": (_bwd_specs(k=(2, 3, 7, 8), v=(2, 3, 6, 8)), FusionDefinitionError, "sequence lengths"),
    "heads": (_bwd_specs(k=(2, 4, 5, 8), v=(2, 4, 5, 8)), FusionDefinitionError, "dim 1"),
}


@pytest.mark.parametrize("name", sorted(BWD_ERRORS))
def test_sdpfa_bwd_definition_errors(name, fusion_scope):
    specs, exc, pattern = BWD_ERRORS[name]
    grad, q, k, v, out, lse, seed, offset = fusion_scope(*specs)
    with pytest.raises(exc, match=f"fd.ops.sdpfa_bwd: .*{pattern}"):
        FusionDefinition.ops.sdpfa_bwd(grad, q, k, v, out, lse, 0.0, False, seed, offset)


def test_sdpfa_bwd_output_shape_mismatch(fusion_scope):
    grad, q, k, v, out, lse, seed, offset, bad_out = fusion_scope(*_bwd_specs(), ((2, 3, 5, 4), F))
    with pytest.raises(FusionDefinitionError, match="fd.ops.sdpfa_bwd: .*'output'"):
        FusionDefinition.ops.sdpfa_bwd(grad, q, k, v, bad_out, lse, 0.0, False, seed, offset)


def test_ops_reject_non_tensors(fusion_scope):
    (a,) = fusion_scope(((3, 4), F))
    with pytest.raises(FusionDtypeError, match="fd.ops.matmul: argument 'arg2' must be a TensorView"):
        FusionDefinition.ops.matmul(a, 2.0)
    with pytest.raises(FusionDtypeError, match="fd.ops.sdpfa_fwd: argument 'query' must be a TensorView"):
        FusionDefinition.ops.sdpfa_fwd(1.0, a, a)
