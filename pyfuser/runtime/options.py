"""Per-call options (nvFuser's NVFUSER_ENABLE / NVFUSER_DISABLE, as execute's _enable/_disable_options)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Sequence

from ..errors import OptionError
from ..ops import run_context

# name -> what it does. Disable options are on by default.
DISABLE_OPTIONS = {
    "infer_contiguity": "meta-device inference of ExprEval segment output layouts (off: assume contiguous)",
    "kernel_codegen": "generated Triton kernels for kernel segments (off: every segment runs on ATen)",
    "matmul_expr_eval": "ATen evaluation of matmul and linear (off: a fusion containing them cannot be scheduled, "
    "as pyfuser has no generated matmul kernel; nvFuser would try its own matmul scheduler)",
    "offset_checks": "checks of group offsets' values (NVFP4 ops, grouped_mm), made on the device by default "
    "(off: the offsets are trusted, as upstream does; kernels still never write outside their buffers)",
}
ENABLE_OPTIONS = {
    "check_layouts": "after each segment, check the real outputs against the inferred layouts (debugging aid)",
    "cuda_graph": "capture the whole fusion in a CUDA graph per input signature and replay it (docs/runtime.md)",
    "cuda_graph_reuse_outputs": "with cuda_graph: return the graph's own output buffers, valid until the next call "
    "of the fusion (no copy per output)",
    "sync_offset_checks": "check group offsets' values on the host at once (one device-to-host copy per op call) "
    "instead of on the device",
}

# nvFuser's own option names (NVFUSER_ENABLE / NVFUSER_DISABLE), accepted so that code written for nvFuser runs.
# They tune nvFuser's CUDA code generator, which pyfuser does not have; none changes what pyfuser computes.
# docs/frontend.md lists them with their pyfuser meaning.
UPSTREAM_ENABLE_OPTIONS = frozenset((
    "cutlass_scheduler", "fuse_matmul", "fuse_multiple_matmuls", "id_model_extra_validation", "io_to_lower_precision",
    "kernel_db", "kernel_debug", "kernel_lineinfo", "kernel_profile", "memory_promotion", "reuse_zeroed_memory",
    "static_fusion_count", "wait_debugger", "warn_register_spill", "tma_pointwise", "tma_inner_persistent",
    "tma_reduction", "ws_normalization", "host_ir_lowering", "host_ir_jit", "insert_resharding_after", "fast_math",
    "p2p_protocol", "p2p_transport", "multicast_protocol",
))
UPSTREAM_DISABLE_OPTIONS = frozenset((
    "compile_to_sass", "contig_indexing", "expr_simplify", "fallback", "fma", "greedy_scheduler", "index_hoist",
    "magic_zero", "nvrtc_caching", "nvtx", "parallel_compile", "predicate_elimination",
    "python_inline_definitions", "kernel_reuse", "var_name_remapping", "welford_vectorization", "resize_scheduler",
    "multidevice",
))


@dataclass(frozen=True)
class Options:
    infer_contiguity: bool = True
    kernel_codegen: bool = True
    offset_checks: bool = True
    matmul_expr_eval: bool = True
    check_layouts: bool = False
    cuda_graph: bool = False
    cuda_graph_reuse_outputs: bool = False
    sync_offset_checks: bool = False
    # The options as one int, one bit per field: what every call's cache key holds (an int hashes and compares in
    # C; a dataclass's __hash__ is a Python call, made twice per call).
    bits: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self):
        values = [getattr(self, f.name) for f in fields(self) if f.compare]
        object.__setattr__(self, "bits", sum(1 << i for i, value in enumerate(values) if value))


_ENV_VARS = ("PYFUSER_ENABLE", "NVFUSER_ENABLE", "PYFUSER_DISABLE", "NVFUSER_DISABLE")
_ENV_KEYS = tuple(os.fsencode(v) for v in _ENV_VARS)
_K0, _K1, _K2, _K3 = _ENV_KEYS


def _env_snapshot() -> tuple:
    """The four option variables' raw values. This runs on every execute, so it reads CPython's underlying
    byte mapping (about 0.1 µs a variable) rather than os.environ's encoding __getitem__ (about 1 µs)."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        get = data.get
        return get(_K0), get(_K1), get(_K2), get(_K3)
    return tuple(os.environ.get(v) for v in _ENV_VARS)


def _names(raw) -> tuple[str, ...]:
    if raw is None:
        return ()
    text = os.fsdecode(raw) if isinstance(raw, bytes) else raw
    return tuple(n.strip() for n in text.split(",") if n.strip())


@lru_cache(maxsize=256)
def _parse(enable: tuple, disable: tuple, env: tuple) -> Options:
    enable = enable + _names(env[0]) + _names(env[1])
    disable = disable + _names(env[2]) + _names(env[3])
    for name in enable:
        if name not in ENABLE_OPTIONS and name not in UPSTREAM_ENABLE_OPTIONS:
            raise OptionError(f"unknown enable option {name!r}; known: {sorted(ENABLE_OPTIONS)} and nvFuser's")
    for name in disable:
        if name not in DISABLE_OPTIONS and name not in UPSTREAM_DISABLE_OPTIONS:
            raise OptionError(f"unknown disable option {name!r}; known: {sorted(DISABLE_OPTIONS)} and nvFuser's")
    return Options(
        infer_contiguity="infer_contiguity" not in disable,
        kernel_codegen="kernel_codegen" not in disable,
        offset_checks="offset_checks" not in disable,
        matmul_expr_eval="matmul_expr_eval" not in disable,
        check_layouts="check_layouts" in enable,
        cuda_graph="cuda_graph" in enable,
        cuda_graph_reuse_outputs="cuda_graph_reuse_outputs" in enable,
        sync_offset_checks="sync_offset_checks" in enable,
    )


def offset_check_mode(options: Options) -> str:
    """The ops' offset-check mode (pyfuser/ops/offset_checks.py) these options select."""
    if not options.offset_checks:
        return run_context.OFFSET_CHECKS_OFF
    return run_context.OFFSET_CHECKS_SYNC if options.sync_offset_checks else run_context.OFFSET_CHECKS_DEVICE


_last_default: list = [None, None]  # [environment snapshot, Options] of the last call without explicit options


def default_options() -> Options:
    """The options of a call without explicit ones: PYFUSER_/NVFUSER_ENABLE and _DISABLE from the environment,
    parsed again only when those variables changed since the last such call."""
    env = _env_snapshot()
    last_env, options = _last_default
    if last_env == env:
        return options
    options = _parse((), (), env)
    _last_default[:] = env, options
    return options


def parse_options(enable: Sequence[str] = (), disable: Sequence[str] = ()) -> Options:
    """Options for one call: the arguments plus PYFUSER_/NVFUSER_ENABLE and _DISABLE from the environment."""
    if not enable and not disable:  # the common call: no explicit options
        return default_options()
    if isinstance(enable, str) or isinstance(disable, str):
        raise OptionError("_enable_options/_disable_options take a list of option names, not a string")
    return _parse(tuple(enable), tuple(disable), _env_snapshot())
