"""A model of the few PTX instructions pyfuser's inline assembly uses, so that CPU tests can run the GPU-only paths
(the interpreter cannot execute inline PTX) against the element-wise forms the interpreter does run."""

from __future__ import annotations

import re

import numpy as np


def _f16x2(x: int) -> np.ndarray:
    return np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16)


def _prmt(a: int, b: int, selector: int) -> int:
    """prmt.b32 in its default mode: bytes 0-3 of ``a``, 4-7 of ``b``; a selector's top bit replicates the selected
    byte's sign bit into all 8 bits."""
    data = a | (b << 32)
    out = 0
    for i in range(4):
        sel = (selector >> (4 * i)) & 0xF
        byte = (data >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> index) & 1) << bit
    return out


def _mul_f16x2(a: int, b: int) -> int:
    with np.errstate(all="ignore"):
        z = (_f16x2(a) * _f16x2(b)).view(np.uint16)
    return int(z[0]) | (int(z[1]) << 16)


_OPS = {
    "mad.lo.u32": lambda v: v[0] * v[1] + v[2],
    "sub.u32": lambda v: v[0] - v[1],
    "and.b32": lambda v: v[0] & v[1],
    "or.b32": lambda v: v[0] | v[1],
    "xor.b32": lambda v: v[0] ^ v[1],
    "shl.b32": lambda v: v[0] << v[1] if v[1] < 32 else 0,
    "shr.u32": lambda v: v[0] >> v[1],
    "prmt.b32": lambda v: _prmt(*v),
    "lop3.b32": lambda v: _lop3(*v),
    "mul.f16x2": lambda v: _mul_f16x2(*v),
}


def run_ptx(ptx: str, operands: dict, outputs: int = 1) -> list:
    """The b32 results $0 .. $(outputs - 1) of ``ptx`` given its 32-bit input operands ({index: value}, e.g.
    {1: x} for $1), executed line by line; an instruction without a model fails the calling test."""
    regs = {f"${i}": v & 0xFFFFFFFF for i, v in operands.items()}

    def val(tok):
        return int(tok, 0) & 0xFFFFFFFF if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok) else regs[tok]

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dest, *src = [a.strip() for a in args.split(",")]
        assert op in _OPS, f"no model for {op}"
        regs[dest] = _OPS[op]([val(a) for a in src]) & 0xFFFFFFFF
    return [regs[f"${i}"] for i in range(outputs)]
