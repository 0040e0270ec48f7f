"""The tail of a tanh-GELU whose result is only rounded to bf16, with a cheap tanh and an exact fallback.

A tanh-GELU (``0.5 * y * (1 + tanh(z))``, each op rounded to fp32 as eager's separate kernels round it) ends in
``g = RN(h * RN(1 + tanh(z)))``, with ``h = 0.5 * y``. Eager's CUDA ``tanhf`` (libdevice's, which the prelude's
``_tanh_f32`` copies) has two halves: an odd polynomial for |z| < 0.6 and ``1 - 2 / (2^(2|z|/ln 2) + 1)`` with
z's sign above. Computing both and selecting costs about 16 instructions of the kernel's 35 per element on the
H200, which is what holds a bf16 tanh-GELU under the copy roofline (it is bound by instruction issue).

Here the fast path computes the exp form for every z: for |z| >= 0.6 it *is* libdevice's result, with the same
instructions but one select: libdevice sets t to 1 from |z| >= 9.0109 on (0x41102CB4), and there the exp form
already rounds t to exactly 1. At that bound 2|z|/ln 2 rounds to 26.000002, so 2 / (2^26.000002 + 1) lies below
2^-25 by about 1.3e-6 of itself, more than the approximations' errors (ex2.approx 2^-22 relative, rcp.approx one
ulp), and 1 - that rounds up to 1; further out the margin only grows, and an infinite exp gives 1 too. Dropping
the compare and select saves 2 of the fast path's instructions per element. For |z| < 0.6 its ``u = RN(1 + t)``
differs from the polynomial's by at most ``U_ABS_ERROR``
(both facts measured on the GPU over every fp32 z: ``tests/test_gelu_tanh_bf16.py``). Then ``g = RN(h * u)``
moves by at most ``|h| U_ABS_ERROR`` plus a rounding, and there u lies in (0.46, 1.54), so |h| <= |g| / 0.46:
at most ``2^24 U_ABS_ERROR / 0.46 + 2`` ulps of g (``window``: 37; where the largest difference was measured on
the GPU's architecture, ``MEASURED_U_ABS_ERROR``, that bound sets it: 11 on sm_90). The bf16 rounding of g can
only differ from the exact one's if a bf16 rounding midpoint (low 16 bits 0x8000) lies that close: such g take the
exact path, libdevice's polynomial where |z| < 0.6, four lanes behind one branch that warps rarely take. So the
bf16 result is eager's bit for bit; only the fp32 g may differ, which is why the rewrite applies only where g is
read by conversions to bf16 alone and nothing before it is stored (``kernel_builder._bf16_tanh_gelu_tails``). GPU
only: the interpreter cannot run PTX.
"""

from __future__ import annotations

import math

import torch

# A bound on |fast u - exact u| over every fp32 |z| < 0.6, for any GPU. From the instructions' documented errors
# (ex2.approx 2^-22 relative, rcp.approx 2^-23, libdevice's tanhf 2 ulps, the roundings of 2|z|/ln 2, E + 1, 1 - 2r
# and 1 + t) the fast t is within 2^-21.4 of tanh, the exact one within 2^-23, and the two u within 2^-20.7.
U_ABS_ERROR = 2.0 ** -20
# The largest |fast u - exact u| over every fp32 |z| < 0.6, measured on a GPU of that compute capability (the fast u
# is a fixed function of z there: ex2.approx and rcp.approx are the SM's own approximations, the same on every chip
# of one architecture). sm_90: 2^-22.00, on an H100 (2026-12-06; the H200 has the same SM). The GPU test measures
# it again on the device it runs on and fails if it exceeds the bound that device's kernels use (device_bound).
MEASURED_U_ABS_ERROR = {(9, 0): 2.0 ** -22}
# 1 + tanh(z) for |z| < 0.6 is at least 1 - tanh(0.6) = 0.4629...
_MIN_U = 0.4629


def window(u_abs_error: float) -> int:
    """ulps of g (distance in bit patterns) within which the fast and the exact g lie, for a bound on their u's
    difference: g = RN(h u) moves by at most |h| u_abs_error plus a rounding, and |h| <= |g| / 0.4629. A g whose low
    16 bits are within this many of 0x8000 takes the exact path."""
    return math.ceil(2.0 ** 24 * u_abs_error / _MIN_U) + 2


WINDOW = window(U_ABS_ERROR)  # 37, for a GPU whose architecture was not measured


def device_bound(capability=None) -> float:
    """The bound for a compute capability: measured where MEASURED_U_ABS_ERROR has it, else the documented
    U_ABS_ERROR. By default, the largest over the visible CUDA devices (the generated source, and so its window, is
    shared by every device of the process), and U_ABS_ERROR without a GPU. On sm_90 the window narrows from 37 to
    11 ulps: about 13% -> 4% of four-lane groups take the exact path (g's low bits spread evenly), some 0.8 of the
    kernel's 27 instructions per element."""
    if capability is not None:
        return MEASURED_U_ABS_ERROR.get(tuple(capability), U_ABS_ERROR)
    if not torch.cuda.is_available():
        return U_ABS_ERROR
    return max(device_bound(torch.cuda.get_device_capability(d)) for d in range(torch.cuda.device_count()))


TEMPLATE = "_gelu_tanh_tail_bf16({0}, {1})"  # z, h: the kernel IR op replacing g = h * (tanh(z) + 1)
# z, y: the same where h = 0.5 * y. The tail then computes u/2 = RN(0.5 + 0.5 t) by one multiply-add (exact: it is
# RN(1 + t) scaled by a power of two, and u >= 2^-24 is normal) where it added 1, and g = RN(y * u/2), which is
# RN(h * u): one rounding of the same real, as h = 0.5 y is exact, unless y is subnormal. So the form is only taken
# where a subnormal y makes u = 1 (then both are RN(y / 2)): where z is a polynomial in y without a constant term and
# with small coefficients (kernel_builder._halved), as in a GELU, so that |tanh z| <= |z| < 2^-25 for |y| < 2^-126.
# The multiply by 0.5 before the tail goes: one instruction per element.
TEMPLATE_HALF = "_gelu_tanh_tail_bf16_half({0}, {1})"


def _plus_one(dst: str, src: str, half: bool) -> str:
    """u = RN(1 + src), or u/2 = RN(0.5 + 0.5 src) in the half form (then $(8+k) is y, not h)."""
    return (f"fma.rn.f32 {dst}, {src}, 0f3F000000, 0f3F000000;" if half else
            f"add.rn.f32 {dst}, {src}, 0f3F800000;")


def _lane(k: int, half: bool, w: int) -> str:
    """The fast path of lane k: $k is g, $(4+k) is z, $(8+k) is h (y in the half form); w: the window."""
    z, h = f"${4 + k}", f"${8 + k}"
    return f"""
        abs.f32 a{k}, {z};
        mul.rn.f32 e, a{k}, 0f4038AA3B;
        ex2.approx.ftz.f32 e, e;
        add.rn.f32 e, e, 0f3F800000;
        rcp.approx.ftz.f32 e, e;
        fma.rn.f32 t, e, 0fC0000000, 0f3F800000;
        mov.b32 b, t;
        and.b32 s, {z}, 0x80000000;
        or.b32 b, b, s;
        mov.b32 t, b;
        {_plus_one("t", "t", half)}
        mul.rn.f32 g{k}, {h}, t;
        mov.b32 b, g{k};
        mad.lo.u32 b, b, 65536, {((0x8000 + w) & 0xFFFF) << 16:#x};
        setp.le.{"" if k == 0 else "or."}u32 slow, b, {(2 * w) << 16:#x}{"" if k == 0 else ", slow"};"""


def _exact_lane(k: int, half: bool = False) -> str:
    """libdevice's polynomial half for lane k where |z| < 0.6 (NaN included: setp.ltu), and g from it."""
    z, h = f"${4 + k}", f"${8 + k}"
    return f"""
        setp.ltu.f32 small, a{k}, 0f3F19999A;
        mul.rn.f32 x2, {z}, {z};
        fma.rn.f32 p, 0f3C80F082, x2, 0fBD563CAE;
        fma.rn.f32 p, p, x2, 0f3E085941;
        fma.rn.f32 p, p, x2, 0fBEAAA9ED;
        fma.rn.f32 p, p, x2, 0f00000000;
        fma.rn.f32 p, p, {z}, {z};
        {_plus_one("p", "p", half)}
        @small mul.rn.f32 g{k}, {h}, p;"""


def ptx_block(exact_path: bool = True, half: bool = False, w: int = WINDOW) -> str:
    """The inline-PTX block of four lanes ($0-$3: g, $4-$7: z, $8-$11: h, or y with ``half``) for the window w;
    without ``exact_path``, the fast path alone (what the GPU test measures the error bound on)."""
    exact = (f"\n        @!slow bra GELU_DONE_${{:uid}};{''.join(_exact_lane(k, half) for k in range(4))}"
             f"\n        GELU_DONE_${{:uid}}:") if exact_path else ""
    return f"""{{
        .reg .f32 a<4>, g<4>, e, t, x2, p;
        .reg .b32 b, s;
        .reg .pred small, slow;{"".join(_lane(k, half, w) for k in range(4))}{exact}
        mov.b32 $0, g0;
        mov.b32 $1, g1;
        mov.b32 $2, g2;
        mov.b32 $3, g3;
        }}"""


def prelude(w: int) -> str:
    """The kernels' helpers for the window w (device_bound's, through window)."""
    return f'''

@triton.jit
def _gelu_tanh_tail_bf16(z, h):
    # g = h * (tanh(z) + 1) for a g only ever rounded to bf16 (codegen/gelu_tanh_bf16.py): tanh in libdevice's
    # exp form for every z, exact for |z| >= 0.6; g whose low 16 bits lie within {w} of a bf16 rounding
    # midpoint recompute tanh with libdevice's polynomial where |z| < 0.6. The bf16 rounding is libdevice's.
    return tl.inline_asm_elementwise(
        """{ptx_block(w=w)}""",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [z, h], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _gelu_tanh_tail_bf16_half(z, y):
    # The same for h = 0.5 * y, from y: u/2 = RN(0.5 + 0.5 t) and g = RN(y * u/2), which is RN(h * u).
    return tl.inline_asm_elementwise(
        """{ptx_block(half=True, w=w)}""",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [z, y], dtype=tl.float32, is_pure=True, pack=4)
'''
