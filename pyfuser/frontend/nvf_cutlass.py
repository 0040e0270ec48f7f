"""nvFuser's ``nvfuser_direct.nvf_cutlass`` functions, on pyfuser's own kernels (docs/nvfp4.md, "nvFuser's
nvf_cutlass functions").

nvFuser binds Blackwell-only CUTLASS kernels under these names; code written for it does
``from nvfuser_direct import nvf_cutlass``. Here:

- ``nvfp4_scaled_grouped_mm``: pyfuser's NVFP4 grouped GEMM (``pyfuser.kernels.nvfp4_grouped_gemm``), with the
  operand contract and offset checks of ``fd.ops.cutlass_nvfp4_grouped_mm``. Exact products, fp32 accumulation,
  one rounding to the output dtype.
- ``nvfp4_scaled_mm``: the same kernel with one group.
- ``nvfp4_scaled_mm_blockscale``: that GEMM (bf16 result) then pyfuser's NVFP4 quantize kernel.
- ``mxfp8_scaled_mm``: an ATen composition (un-swizzle, exact dequantization, fp32 matmul), not a fused kernel.
- ``grouped_mm``: ``torch._grouped_mm`` where the device runs it, else a per-group loop of ``torch.mm``.

Every argument is checked; a violation raises :class:`InputValidationError` (a ValueError and RuntimeError) whose
message starts with ``nvf_cutlass.<function>:`` and names the argument with nvFuser's parameter name. A
combination pyfuser cannot run (K a multiple of 32 but not of 64 for NVFP4, a device Triton cannot use) raises
:class:`UnsupportedOpError`. The values of the grouped functions' offsets and problem sizes (CUTLASS trusts them)
are checked on every call: on CPU tensors at once (InputValidationError); on CUDA on the device, as the fd ops
check them, since a host read would stall every call: the check ORs its findings into pinned host flags (inside
the decode GEMM's own launch, else as a launch of its own), and the next call of any of these functions after
the GPU has finished the bad one raises :class:`FusionExecutionError` naming the check (that call's output is
invalid). Bad values give wrong placements, never reads or writes outside the operands.

The NVFP4 functions keep their prepared launches per operand signature (sizes, strides, dtypes, devices, the
alignment the kernels need and scale1's storage size), as a cached fusion does: a repeated call skips the checks
and the launch set-up and only allocates and launches. On the CPU machine with the launch stubbed, a repeated
grouped GEMM call takes 6.4 us of host time against 57 us when prepared on every call.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading
from collections import OrderedDict
from typing import Optional

import torch

from ..codegen.launcher import triton_usable
from ..errors import FusionExecutionError, InputTypeError, InputValidationError, UnsupportedOpError
from ..kernels.nvfp4_grouped_gemm import GroupedGemm
from ..kernels.nvfp4_layout import BlockQuantize
from ..nvfp4.gemm_contract import check_operands, out_torch_dtype
from ..nvfp4.reference import swizzled_to_linear_128_4
from ..ops.common import round_up
from ..ops.mxfp8 import BLOCK_SIZE as _MXFP8_BLOCK
from ..ops import run_context
from ..ops.narrow_precision import gemm_contract
from ..ops.offset_checks import GroupCheck, PreparedGroupCheck, check_group_offsets, host_ints
from ..runtime.device_errors import SLOTS, DeviceErrorSink
from ..runtime.input_guard import InputGuard
from ..runtime.signature import flat_signature

__all__ = ["grouped_mm", "mxfp8_scaled_mm", "nvfp4_scaled_grouped_mm", "nvfp4_scaled_mm",
           "nvfp4_scaled_mm_blockscale"]

_FP4 = (torch.float4_e2m1fn_x2, torch.uint8)  # uint8: the same packed bytes (as the GEMM contract accepts)
_HALF = (torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------------------------
# errors


def _fail(fn: str, msg: str, cls=InputValidationError):
    raise cls(f"nvf_cutlass.{fn}: {msg}")


# What the reused checks call the operands -> nvFuser's parameter names, per function.
_GROUPED_NAMES = {"mat1": "a", "mat2": "b", "scale1": "a_blockscale", "scale2": "b_blockscale", "alpha": "alphas"}
_DENSE_NAMES = {"mat1": "a", "mat2": "b", "scale1": "scales_a", "scale2": "scales_b", "alpha": "alpha"}
_PREFIX = re.compile(r"^(fd\.ops\.[\w.]+: )?(nvfp4_grouped_mm: )?")


@contextlib.contextmanager
def _reported_as(fn: str, names: dict):
    """Re-raise a failed check of the GEMM's contract or of the offsets (shared with fd.ops.cutlass_nvfp4_grouped_mm)
    as this function's InputValidationError, with nvFuser's argument names."""
    try:
        yield
    except (ValueError, FusionExecutionError) as e:
        raise InputValidationError(f"nvf_cutlass.{fn}: {_renamed(_PREFIX.sub('', str(e)), names)}") from None


def _renamed(msg: str, names: dict) -> str:
    """``msg`` with the reused checks' operand names replaced by nvFuser's."""
    if not names:
        return msg
    return re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m.group(1)], msg)


def _tensor(fn: str, x, name: str, dtypes, what: str, rank: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        _fail(fn, f"{name} must be a tensor ({what}), got {type(x).__name__}", InputTypeError)
    if x.dtype not in dtypes:
        _fail(fn, f"{name} must be {what}, got dtype {x.dtype}", InputTypeError)
    if x.dim() != rank:
        _fail(fn, f"{name} must be {what} (rank {rank}), got shape {tuple(x.shape)}")
    return x


def _contiguous(fn: str, x: torch.Tensor, name: str, what: str) -> None:
    if not x.is_contiguous():
        _fail(fn, f"{name} must be a contiguous {what}, got strides {tuple(x.stride())}")


def _same_device(fn: str, **tensors) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        _fail(fn, f"all tensors must be on one device, got {', '.join(f'{k} on {v}' for k, v in devices.items())}",
              InputValidationError)
    return next(iter(devices.values()))


def _triton_device(fn: str, dev: torch.device) -> None:
    if not triton_usable(dev):
        _fail(fn, f"runs pyfuser's Triton kernels, which need CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
                  f"got tensors on {dev}", UnsupportedOpError)


def _out_dtype(fn: str, out_dtype) -> torch.dtype:
    """bfloat16 or float16, the output types of nvFuser's CUTLASS GEMMs and of pyfuser's NVFP4 GEMM."""
    if not isinstance(out_dtype, torch.dtype):
        _fail(fn, f"out_dtype must be a torch.dtype (torch.bfloat16 or torch.float16), got {out_dtype!r}",
              InputTypeError)
    with _reported_as(fn, {}):
        return out_torch_dtype(out_dtype)


def _nvfp4_k(fn: str, k: int) -> None:
    """nvFuser's CUTLASS kernels take K % 32 == 0; pyfuser's GEMM reads K in 64-value steps (int32 words of 8 codes
    per k-plane), so it also needs K % 64 == 0."""
    if k % 32:
        _fail(fn, f"K must be a multiple of 32, got K={k}")
    if k % 64:
        _fail(fn, f"K={k} is not a multiple of 64: pyfuser's NVFP4 GEMM needs K % 64 == 0", UnsupportedOpError)


def _scalar(fn: str, x, name: str) -> torch.Tensor:
    """A float32 scalar tensor (0-dim or one element), as the CUTLASS kernels read it (one value from device memory)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        _fail(fn, f"{name} must be a float32 scalar tensor, got {got}", InputTypeError)
    if x.numel() != 1:
        _fail(fn, f"{name} must be a float32 scalar tensor (0-dim or one element), got shape {tuple(x.shape)}")
    return x.reshape(())


def _strides_vectors(fn: str, g: int, **vectors) -> None:
    """CUTLASS's per-group stride arrays: pyfuser derives the strides from the tensors, so only their form is
    checked."""
    for name, t in vectors.items():
        _tensor(fn, t, name, (torch.int64,), f"int64 [g={g}]", 1)
        if t.shape[0] != g:
            _fail(fn, f"{name} must be int64 [g={g}], got shape {tuple(t.shape)}")


# Where the device-side value checks of CUDA calls report (runtime/device_errors.py): every check site (a prepared
# launch, a grouped_mm signature) has a slot of its own, so a flag is explained by the check that set it.
_ERRORS = DeviceErrorSink(origin="an earlier nvf_cutlass call; that call's output is invalid",
                          remedy="torch.cuda.synchronize() before the next call reports it at once")
_SLOT_NUMBERS = itertools.count()
_DEFERRED_DEVICES = frozenset({"cuda"})  # where value checks run on the device (elsewhere they read the values)


class _ValueCheck:
    """The value check of one check site's offsets (fixed metadata): on CPU the values are read at once (a bad
    one raises); on CUDA the check runs on the device into the site's slot of ``_ERRORS``."""

    __slots__ = ("prepared", "slot")

    def __init__(self, check: GroupCheck):
        self.prepared = PreparedGroupCheck(check)
        self.slot = next(_SLOT_NUMBERS) % SLOTS

    def _enter(self, dev: torch.device):
        errors = _ERRORS if dev.type in _DEFERRED_DEVICES else None  # (None: the values are read on the host)
        return run_context.enter(run_context.RunContext(dev, run_context.OFFSET_CHECKS_DEVICE, errors, self.slot))

    def __call__(self, starts, outs, sizes) -> None:
        """Check now (CPU) or launch the device check (CUDA)."""
        token = self._enter(starts.device)
        try:
            self.prepared(starts, outs, sizes)
        finally:
            run_context.leave(token)

    def flag(self, starts, outs, sizes) -> Optional[torch.Tensor]:
        """For a launch that runs the check itself (the decode GEMM): the int32 flag it ORs its bits into on CUDA;
        None on CPU, where the values were checked here."""
        token = self._enter(starts.device)
        try:
            return self.prepared.device_flag(starts, outs, sizes)
        finally:
            run_context.leave(token)


def _report_device_errors() -> None:
    """Raise what the device checks of earlier calls flagged, once the GPU has finished them (a host memory read;
    never waits; not under a caller's CUDA-graph capture: DeviceErrorSink.report_flagged). The
    messages name the function whose call flagged them, which need not be this call's, with nvFuser's argument
    names (only the grouped GEMM's checks name operands other than the offsets)."""
    if not _ERRORS.flagged():
        return
    try:
        _ERRORS.report_flagged(torch.cuda.is_available())
    except FusionExecutionError as e:
        raise FusionExecutionError(_renamed(str(e).replace("fd.ops.nvf_cutlass.", "nvf_cutlass."),
                                            _GROUPED_NAMES)) from None


def _groups(fn: str, problem_sizes) -> int:
    ps = _tensor(fn, problem_sizes, "problem_sizes", (torch.int32,), "int32 [g, 3]", 2)
    if ps.shape[0] < 1 or ps.shape[1] != 3:
        _fail(fn, f"problem_sizes must be int32 [g, 3] with g >= 1, got shape {tuple(ps.shape)}")
    return ps.shape[0]


# ----------------------------------------------------------------------------------------------------------------
# prepared launches, per operand signature

_PREPARED: "OrderedDict[tuple, object]" = OrderedDict()
_PREPARED_MAX = 64
_PREPARED_LOCK = threading.Lock()
# Per function, its last call's (input guard, out_dtype, storage sizes, prepared launch): a call that repeats it,
# the usual case, is told by the guard (one C++ check of every tensor, runtime/input_guard.py) instead of the
# signature built in Python (~10 us for the grouped GEMM's ten tensors on the CPU machine).
_LAST: dict = {}


def _signature(fn: str, out_dtype, tensors, storage=()) -> tuple | None:
    """What a prepared launch of ``fn`` depends on: the operands' signature as the executor cache encodes it
    (runtime/signature.py: metadata and pointer alignment classes) and the storage size behind ``storage`` (scale
    reads are bounded by it). None when an argument is not a tensor or out_dtype not a dtype: the checks of the
    slow path then name it."""
    if not isinstance(out_dtype, torch.dtype) or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    return fn, out_dtype, flat_signature(tensors), _storage_sizes(storage)


def _storage_sizes(storage) -> tuple:
    return tuple(t.untyped_storage().nbytes() - t.storage_offset() for t in storage)


def _prepared(fn: str, out_dtype, tensors, build, storage=()):
    """The prepared launch of ``fn`` for these operands (see _signature), built (checks included) on the first call
    of their signature; LRU over _PREPARED_MAX signatures."""
    last = _LAST.get(fn)
    if last is not None:
        guard, dtype, sizes, found = last
        if dtype is out_dtype and guard.matches(list(tensors)) and _storage_sizes(storage) == sizes:
            return found
    key = _signature(fn, out_dtype, tensors, storage)
    if key is None:
        return build()
    found = _PREPARED.get(key)
    if found is None:
        found = build()
        with _PREPARED_LOCK:
            _PREPARED[key] = found
            while len(_PREPARED) > _PREPARED_MAX:
                _PREPARED.popitem(last=False)
    guard = InputGuard.build(0, None, list(tensors))
    if guard:
        _LAST[fn] = (guard, out_dtype, _storage_sizes(storage), found)
    return found


# ----------------------------------------------------------------------------------------------------------------
# NVFP4


def nvfp4_scaled_grouped_mm(a, b, a_blockscale, b_blockscale, alphas, ab_strides, c_strides, problem_sizes,
                            expert_offsets, sf_offsets, out_dtype) -> torch.Tensor:
    """Grouped NVFP4 GEMM: ``out[e_i : e_i + m_i] = alphas[i] * dequant(a[e_i : e_i + m_i]) @ dequant(b[i]).T``.

    ``a`` packed fp4 ``[m, k/2]``; ``b`` packed fp4 ``[g, n, k/2]`` (row-major per expert); ``a_blockscale`` e4m3 in
    the grouped 128x4-swizzled layout (the layout op's result, group i from row ``sf_offsets[i]``);
    ``b_blockscale`` e4m3 ``[g, roundup(n,128), k/16]``, each slice swizzled; ``alphas`` float32 ``[g]``;
    ``ab_strides``/``c_strides`` int64 ``[g]`` (CUTLASS's; the strides follow from the tensors here);
    ``problem_sizes`` int32 ``[g, 3]`` rows (m_i, n, k); ``expert_offsets``/``sf_offsets`` int32 ``[g]`` start rows.
    Returns a contiguous ``[m, n]`` tensor of ``out_dtype`` (bfloat16 or float16); rows before the first group are
    zero. pyfuser's Triton grouped GEMM (exact products, fp32 accumulation, one rounding), with
    ``fd.ops.cutlass_nvfp4_grouped_mm``'s checks, including its N % 128 == 0 rule."""
    fn = "nvfp4_scaled_grouped_mm"
    operands = (a, b, a_blockscale, b_blockscale, alphas, ab_strides, c_strides, problem_sizes, expert_offsets,
                sf_offsets)

    def prepare():
        _tensor(fn, b, "b", _FP4, "packed fp4 (float4_e2m1fn_x2) [g, n, k/2]", 3)
        _contiguous(fn, b, "b", "[g, n, k/2] weight")
        g = _groups(fn, problem_sizes)
        _strides_vectors(fn, g, ab_strides=ab_strides, c_strides=c_strides)
        _nvfp4_k(fn, b.shape[2] * 2)
        dtype = _out_dtype(fn, out_dtype)
        with _reported_as(fn, _GROUPED_NAMES):
            *shapes, check = gemm_contract(f"nvf_cutlass.{fn}", a, b.transpose(-1, -2), a_blockscale, b_blockscale,
                                           alphas, problem_sizes, expert_offsets, sf_offsets)
        _triton_device(fn, a.device)
        return GroupedGemm(a, b.transpose(-1, -2), a_blockscale, b_blockscale, alphas, problem_sizes,
                           expert_offsets, sf_offsets, dtype, shapes=tuple(shapes), check=check), _ValueCheck(check)

    _report_device_errors()
    gemm, values = _prepared(fn, out_dtype, operands, prepare, storage=(a_blockscale,))
    operands = (a, b.transpose(-1, -2), a_blockscale, b_blockscale, alphas, problem_sizes, expert_offsets, sf_offsets)
    with _reported_as(fn, _GROUPED_NAMES):  # the values, on every call
        if gemm.fuses_check:  # (decode: the GEMM's own launch runs the device check)
            return gemm(*operands, check_flags=values.flag(expert_offsets, sf_offsets, problem_sizes))
        values(expert_offsets, sf_offsets, problem_sizes)
    return gemm(*operands)


@functools.lru_cache(maxsize=64)
def _one_group(m: int, n: int, k: int, dev: torch.device) -> dict:
    """The grouped kernel's metadata for one group of [m, n, k], made once per shape: a fresh device tensor from
    host values would cost a host-to-device copy on every call. (The kernel only reads them.)"""
    return dict(problem_sizes=torch.tensor([[m, n, k]], dtype=torch.int32, device=dev),
                expert_offsets=torch.zeros(1, dtype=torch.int32, device=dev),
                sf_offsets=torch.zeros(1, dtype=torch.int32, device=dev))


def _dense_nvfp4_gemm(fn: str, a, b, scales_a, scales_b, alpha, out_dtype) -> torch.Tensor:
    """``alpha * dequant(a) @ dequant(b).T`` through the grouped kernel with one group: group 0 starts at row 0 of
    both a and its scales, so the grouped scale layout of one group IS the single 128x4-swizzled layout."""
    gemm, one_group = _prepared(fn, out_dtype, (a, b, scales_a, scales_b, alpha),
                                lambda: _prepare_dense_nvfp4_gemm(fn, a, b, scales_a, scales_b, alpha, out_dtype),
                                storage=(scales_a,))
    return gemm(a, b.unsqueeze(0).transpose(-1, -2), scales_a, scales_b.unsqueeze(0), alpha.reshape(1),
                *one_group.values())


def _prepare_dense_nvfp4_gemm(fn: str, a, b, scales_a, scales_b, alpha, out_dtype) -> tuple:
    """(the one-group GroupedGemm, its metadata tensors), after checking the operands."""
    _tensor(fn, a, "a", _FP4, "packed fp4 (float4_e2m1fn_x2) [m, k/2]", 2)
    _tensor(fn, b, "b", _FP4, "packed fp4 (float4_e2m1fn_x2) [n, k/2]", 2)
    _contiguous(fn, b, "b", "[n, k/2] matrix")
    (m, k), n = (a.shape[0], a.shape[1] * 2), b.shape[0]
    if b.shape[1] * 2 != k:
        _fail(fn, f"a [m, k/2] and b [n, k/2] must have the same k/2, got {tuple(a.shape)} and {tuple(b.shape)}")
    _nvfp4_k(fn, k)
    if n % 32:
        _fail(fn, f"N must be a multiple of 32, got N={n}")
    for name, s, rows in (("scales_a", scales_a, m), ("scales_b", scales_b, n)):
        want = (round_up(rows, 128), k // 16)
        if isinstance(s, torch.Tensor) and tuple(s.shape) != want:
            _fail(fn, f"{name} must be padded and 128x4-swizzled to shape {want}, got {tuple(s.shape)}")
    alpha = _scalar(fn, alpha, "alpha").reshape(1)
    dev = a.device
    one_group = _one_group(m, n, k, dev)
    mat2 = b.unsqueeze(0).transpose(-1, -2)
    dtype = _out_dtype(fn, out_dtype)
    with _reported_as(fn, _DENSE_NAMES):
        shapes = check_operands(a, mat2, scales_a, scales_b.unsqueeze(0), alpha, *one_group.values())
    _triton_device(fn, dev)
    return GroupedGemm(a, mat2, scales_a, scales_b.unsqueeze(0), alpha, *one_group.values(), dtype,
                       shapes=shapes), one_group


def nvfp4_scaled_mm(a, b, scales_a, scales_b, alpha, out_dtype) -> torch.Tensor:
    """Dense NVFP4 GEMM: ``alpha * dequant(a) @ dequant(b).T``, a contiguous ``[m, n]`` tensor of ``out_dtype``.

    ``a`` packed fp4 ``[m, k/2]``, ``b`` packed fp4 ``[n, k/2]``; ``scales_a``/``scales_b`` e4m3, 128x4-swizzled and
    padded to ``[roundup(m,128), k/16]`` / ``[roundup(n,128), k/16]``; ``alpha`` a float32 scalar tensor;
    ``out_dtype`` bfloat16 or float16. pyfuser's NVFP4 grouped GEMM with one group (exact products, fp32
    accumulation, one rounding). K % 64 == 0 (pyfuser) and N % 32 == 0 (nvFuser)."""
    return _dense_nvfp4_gemm("nvfp4_scaled_mm", a, b, scales_a, scales_b, alpha, out_dtype)


def nvfp4_scaled_mm_blockscale(a_nvfp4, b_nvfp4, scales_a, scales_b, alpha, global_normconst):
    """Dense NVFP4 GEMM whose result is NVFP4-quantized: returns (packed fp4 ``[m, n/2]``, e4m3 block scales in the
    single-group 128x4-swizzled layout ``[roundup(m,128), roundup(n/16,4)]``, zero padding).

    Operands as :func:`nvfp4_scaled_mm`; ``global_normconst`` a float32 scalar tensor, the quantization's global
    (encode) scale. The GEMM result is rounded to bfloat16 before it is quantized (pyfuser's GEMM writes bf16 or
    fp16; bf16 keeps fp32's range), where CUTLASS quantizes the fp32 accumulator: a value near a rounding boundary
    of fp4 or e4m3 can land one code apart. The quantization is ``pyfuser.kernels.nvfp4_layout.block_quantize``
    (the fused ops' order). CUTLASS allocates the scales as ``[m, roundup(n/16,4)]``: the same shape when
    m % 128 == 0, which nvFuser's tests use."""
    fn = "nvfp4_scaled_mm_blockscale"
    gs = _scalar(fn, global_normconst, "global_normconst")
    out = _dense_nvfp4_gemm(fn, a_nvfp4, b_nvfp4, scales_a, scales_b, alpha, torch.bfloat16)

    def prepare():
        _same_device(fn, a_nvfp4=out, global_normconst=gs)
        return BlockQuantize(out, gs, swizzle=True)

    quantize = _prepared(fn + ":quantize", torch.bfloat16, (out, gs), prepare)
    return quantize(out, gs)


# ----------------------------------------------------------------------------------------------------------------
# MXFP8


def _fp32_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """An IEEE float32 matmul whatever the global TF32 setting (which this must not change): where CUDA would use
    TF32 (10-bit mantissa inputs), multiply in float64 and round to float32 instead (at least as accurate)."""
    if x.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        return (x.double() @ y.double()).float()
    return x @ y


def _dequant_mxfp8(fn: str, name: str, data: torch.Tensor, scales, rows: int, k: int) -> torch.Tensor:
    """float32 ``data * scale`` (exact: an e4m3 value times a power of two) from the swizzled e8m0 scales."""
    want = (round_up(rows, 128), round_up(k // _MXFP8_BLOCK, 4))
    _tensor(fn, scales, name, (torch.float8_e8m0fnu,), f"float8_e8m0fnu {want}", 2)
    if tuple(scales.shape) != want:
        _fail(fn, f"{name} must be padded and 128x4-swizzled to shape {want}, got {tuple(scales.shape)}")
    linear = swizzled_to_linear_128_4(scales, rows, k // _MXFP8_BLOCK).to(torch.float32)
    return data.to(torch.float32) * linear.repeat_interleave(_MXFP8_BLOCK, dim=1)


def mxfp8_scaled_mm(a, b, scales_a, scales_b, alpha, out_dtype) -> torch.Tensor:
    """MXFP8 GEMM: ``alpha * dequant(a) @ dequant(b).T``, a contiguous ``[m, n]`` tensor of ``out_dtype``.

    ``a`` ``[m, k]`` and ``b`` ``[n, k]`` float8_e4m3fn; ``scales_a``/``scales_b`` float8_e8m0fnu, one per 32 values
    along k, 128x4-swizzled and padded to ``[roundup(m,128), roundup(k/32,4)]`` (and n); ``alpha`` a float32 scalar
    tensor; ``out_dtype`` bfloat16 or float16. An ATen composition, not a fused kernel (pyfuser has no MXFP8 GEMM
    kernel): the scales are un-swizzled, both operands dequantized exactly to float32, multiplied in IEEE float32
    (no TF32), scaled by alpha and rounded once to ``out_dtype``."""
    fn = "mxfp8_scaled_mm"
    _tensor(fn, a, "a", (torch.float8_e4m3fn,), "float8_e4m3fn [m, k]", 2)
    _tensor(fn, b, "b", (torch.float8_e4m3fn,), "float8_e4m3fn [n, k]", 2)
    (m, k), n = a.shape, b.shape[0]
    if b.shape[1] != k:
        _fail(fn, f"a [m, k] and b [n, k] must have the same k, got {tuple(a.shape)} and {tuple(b.shape)}")
    if k % _MXFP8_BLOCK:
        _fail(fn, f"K must be a multiple of the MXFP8 block size {_MXFP8_BLOCK}, got K={k}")
    dtype = _out_dtype(fn, out_dtype)
    alpha = _scalar(fn, alpha, "alpha")
    _same_device(fn, a=a, b=b, scales_a=scales_a, scales_b=scales_b, alpha=alpha)
    x = _dequant_mxfp8(fn, "scales_a", a, scales_a, m, k)
    y = _dequant_mxfp8(fn, "scales_b", b, scales_b, n, k)
    return (_fp32_matmul(x, y.t()) * alpha).to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# grouped GEMM (bf16 / fp16)


@functools.lru_cache(maxsize=None)
def _grouped_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm runs for this device and dtype (CUDA needs sm_90+ and, in some torch versions,
    bf16; CPU torch has a reference implementation): one tiny call, once per process."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.zeros((16, 16), dtype=dtype, device=device)
        torch._grouped_mm(a, torch.zeros((1, 16, 16), dtype=dtype, device=device),
                          offs=torch.full((1,), 16, dtype=torch.int32, device=device))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _grouped_mm_fits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch._grouped_mm's layout rule: 16-byte aligned strides and base addresses of both operands."""
    width = 16 // a.element_size()
    return (a.shape[1] % width == 0 and b.shape[1] % width == 0 and a.data_ptr() % 16 == 0
            and b.data_ptr() % 16 == 0 and _grouped_mm_runs(a.device, a.dtype))


def _grouped_mm_loop(a, b, problem_sizes, expert_offsets) -> torch.Tensor:
    """One torch.mm per group; needs the offsets on the host (a sync on CUDA), so only where _grouped_mm cannot run."""
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    starts, sizes = host_ints(expert_offsets, problem_sizes)
    for i, start in enumerate(starts):
        rows = sizes[3 * i]
        if rows:
            torch.mm(a[start:start + rows], b[i].t(), out=out[start:start + rows])
    return out


@functools.lru_cache(maxsize=64)
def _grouped_mm_check(m: int, n: int, k: int, offsets_signature) -> _ValueCheck:
    """grouped_mm's value check for offsets and problem sizes of one signature (its device launch is prepared
    for their metadata)."""
    return _ValueCheck(GroupCheck("nvf_cutlass.grouped_mm", m, starts_name="expert_offsets", every_row=False, n=n,
                                  k=k))


def grouped_mm(a, b, ab_strides, c_strides, problem_sizes, expert_offsets) -> torch.Tensor:
    """Grouped GEMM: ``out[e_i : e_i + m_i] = a[e_i : e_i + m_i] @ b[i].T``, a contiguous ``[m, n]`` tensor of a's
    dtype.

    ``a`` ``[m, k]`` and ``b`` ``[g, n, k]`` contiguous, both bfloat16 or both float16; ``ab_strides``/``c_strides``
    int64 ``[g]`` (CUTLASS's; the strides follow from the tensors here); ``problem_sizes`` int32 ``[g, 3]`` rows
    (m_i, n, k); ``expert_offsets`` int32 ``[g]`` start rows: non-decreasing, each group running up to the next
    one's start and the last to m (rows before the first group may be left out). Rows no group covers are ZERO
    (CUTLASS leaves them uninitialized). ``torch._grouped_mm`` with the groups' end offsets where the device runs
    it (fp32 accumulation, one rounding), else one ``torch.mm`` per group."""
    fn = "grouped_mm"
    _tensor(fn, a, "a", _HALF, "bfloat16 or float16 [m, k]", 2)
    _tensor(fn, b, "b", (a.dtype,), f"{a.dtype} (a's dtype) [g, n, k]", 3)
    _contiguous(fn, a, "a", "[m, k] matrix")
    _contiguous(fn, b, "b", "[g, n, k] tensor")
    (m, k), (g, n) = a.shape, b.shape[:2]
    if b.shape[2] != k:
        _fail(fn, f"a [m, k] and b [g, n, k] must have the same k, got {tuple(a.shape)} and {tuple(b.shape)}")
    if _groups(fn, problem_sizes) != g:
        _fail(fn, f"problem_sizes must be int32 [g={g}, 3] (b has {g} groups), got {tuple(problem_sizes.shape)}")
    _tensor(fn, expert_offsets, "expert_offsets", (torch.int32,), f"int32 [g={g}]", 1)
    if expert_offsets.shape[0] != g:
        _fail(fn, f"expert_offsets must be int32 [g={g}], got shape {tuple(expert_offsets.shape)}")
    _strides_vectors(fn, g, ab_strides=ab_strides, c_strides=c_strides)
    _same_device(fn, a=a, b=b, problem_sizes=problem_sizes, expert_offsets=expert_offsets)
    _report_device_errors()
    fits = _grouped_mm_fits(a, b)
    with _reported_as(fn, {}):
        if fits:
            _grouped_mm_check(m, n, k, flat_signature((expert_offsets, problem_sizes)))(expert_offsets, None,
                                                                                        problem_sizes)
        else:  # the loop reads the values on the host anyway: checked at no extra cost
            check_group_offsets(GroupCheck(f"nvf_cutlass.{fn}", m, starts_name="expert_offsets", every_row=False,
                                           n=n, k=k), expert_offsets, None, problem_sizes)
    if not fits:
        return _grouped_mm_loop(a, b, problem_sizes, expert_offsets)
    # Valid groups are consecutive and the last ends at m: torch's end offsets are starts + sizes. Clamped into
    # [0, m] and made non-decreasing on the device, so unchecked (CUDA) values can misplace rows but never make
    # torch read or write outside a and out. Its group 0 starts at row 0, so rows before expert_offsets[0] are
    # computed with b[0] and then zeroed.
    ends = torch.cummax((expert_offsets + problem_sizes[:, 0]).clamp(0, m), dim=0).values.to(torch.int32)
    out = torch._grouped_mm(a, b.transpose(-1, -2), offs=ends)
    before_first = torch.arange(m, device=a.device) < expert_offsets[0]
    return out.masked_fill_(before_first[:, None], 0)
