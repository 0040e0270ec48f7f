"""nvFuser direct-frontend protocols beyond the ops: the cache protocol (cache_compile, fd.fec, del fd._fusion,
stats, LruFusionCache), argument leniency, validate/manual_validate/manual_execute, introspection, repro
scripts, version(), PythonProfiler, repr in nvFuser's printer style, the unsupported scheduling API, and the
module names clients import (register_as_nvfuser_direct, multidevice)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import pyfuser
from harness import DEVICE, make, transposed
from pyfuser import (
    DataType,
    FusionDefinition,
    LRUCache,
    LruFusionCache,
    PythonProfiler,
    TensorView,
    UnsupportedOpError,
    version,
)
from pyfuser.errors import FusionDefinitionError, FusionDtypeError


def relu_add(fd):
    t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    fd.add_output(fd.ops.relu(fd.ops.add(t0, t1)))


def sub_bcast(fd, first_is_bcast=True):
    b = lambda: fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Float)  # noqa: E731
    f = lambda: fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)  # noqa: E731
    if first_is_bcast:
        t0, t1 = b(), f()
    else:
        t1, t0 = f(), b()
    fd.add_output(fd.ops.sub(t0, t1))


def defined(fn, *args):
    with FusionDefinition() as fd:
        fn(fd, *args)
    return fd


# --------------------------------------------------------------------------------------------------------------
# cache protocol


def test_cache_compile_protocol_shares_one_executor_and_runs_after_del_fusion():
    cache = LRUCache(max_fusions=8)
    fds = []
    for _ in range(2):
        fd = defined(relu_add)
        fd.fec = cache.cache_compile(fd.fusion)
        del fd._fusion
        fds.append(fd)
    assert cache.num_fusions() == 1
    assert fds[0].fec is fds[1].fec
    a, b = make((3, 5)), -make((3, 5))
    out = fds[1].execute([a, b])
    torch.testing.assert_close(out[0], torch.relu(a + b))
    # The fusion now lives in the executor: fd.fusion, repr and introspection keep working.
    assert fds[1].fusion is fds[1].fec.fusion()
    assert "fd.ops.relu" in repr(fds[1])
    assert len(fds[1].fusion.inputs()) == 2


def test_cache_compile_distinguishes_input_order():
    cache = LRUCache(max_fusions=10)
    fd0, fd1 = defined(sub_bcast, True), defined(sub_bcast, False)
    fd0.fec = cache.cache_compile(fd0.fusion)
    del fd0._fusion
    fd1.fec = cache.cache_compile(fd1.fusion)
    del fd1._fusion
    assert cache.num_fusions() == 2
    bcast, full = make((1, 4)), make((2, 4))
    torch.testing.assert_close(fd0.execute([bcast, full])[0], bcast - full)
    torch.testing.assert_close(fd1.execute([full, bcast])[0], bcast - full)


def test_lru_cache_stats_text_and_eviction():
    cache = LRUCache(max_fusions=2)
    assert cache.stats() == "Max Fusions Allowed: 2\nThe fusion cache is empty.\n"
    f_relu = lambda fd: relu_add(fd)  # noqa: E731
    cache.cache_compile(defined(f_relu))
    cache.cache_compile(defined(sub_bcast, True))
    cache.cache_compile(defined(f_relu))  # hit: relu_add becomes the most recently used
    assert cache.stats() == (
        "Max Fusions Allowed: 2\n"
        "Total Fusions in Cache: 2\n"
        "Total Unique Fusions Compiled: 2\n"
        "Cache Hits by LRU ordering:\n"
        "\t0 -> 1 hits\n"
        "\t1 -> 0 hits\n"
        "Cache Lookups: 3\n"
        "Cache Hits: 1\n"
        "Hit Rate: 33.3333%\n"
    )
    cache.cache_compile(defined(sub_bcast, False))  # evicts sub_bcast(True), the least recently used
    assert cache.num_fusions() == 2
    before = cache.stats()
    cache.cache_compile(defined(sub_bcast, True))  # a miss again: it was evicted
    assert "Total Unique Fusions Compiled: 4" in cache.stats() and before != cache.stats()


def test_cache_compile_rejects_open_fusion_and_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(max_fusions=0)
    with pytest.raises(ValueError):
        LRUCache(max_fusions=True)
    cache = LRUCache(4)
    with FusionDefinition() as fd:
        relu_add(fd)
        with pytest.raises(FusionDefinitionError, match="still being defined"):
            cache.cache_compile(fd.fusion)
    with pytest.raises(FusionDefinitionError, match="expected a Fusion"):
        cache.cache_compile(42)


def test_lru_fusion_cache_decorator_counts_hits():
    @LruFusionCache(max_fusions=10)
    def create(fn, *args):
        return defined(fn, *args)

    assert create.stats() == "Max Fusions Allowed: 10\nThe fusion cache is empty.\n"
    a, b = make((2, 4)), make((2, 4)) + 0.5
    for _ in range(5):
        fd1 = create(relu_add)
        torch.testing.assert_close(fd1.execute([a, b])[0], torch.relu(a + b))
        fd2 = create(sub_bcast, False)
        torch.testing.assert_close(fd2.execute([b, a[:1]])[0], a[:1] - b)
        assert "_fusion" not in vars(fd1) and fd1.fusion == fd1.fusion and fd1.fusion != fd2.fusion
    assert create.num_fusions() == 2
    stats = create.stats()
    assert "\t0 -> 4 hits\n\t1 -> 4 hits\n" in stats and "Cache Lookups: 10\nCache Hits: 8\nHit Rate: 80%\n" in stats


def test_fusion_equality_is_structural_once_defined():
    f1, f2, f3 = defined(relu_add).fusion, defined(relu_add).fusion, defined(sub_bcast).fusion
    assert f1 == f2 and hash(f1) == hash(f2) and f1 != f3
    with FusionDefinition() as fd:
        relu_add(fd)
        assert fd.fusion != f1  # still open: only equal to itself
        assert fd.fusion == fd.fusion


def test_execute_makes_fec_and_reports_undefined_or_empty_definitions():
    fd = defined(relu_add)
    assert "fec" not in vars(fd)
    fd.execute([make((2, 2)), make((2, 2))])
    assert fd.fec.num_runtimes() == 1 and fd._executor is fd.fec.executor_cache
    with pytest.raises(NotImplementedError, match="Fusion does not exist"):
        FusionDefinition().execute([make((2, 2))])
    with FusionDefinition() as empty:
        pass
    with pytest.raises(NotImplementedError, match="Fusion is empty"):
        empty.execute([])


def test_fec_execute_takes_nvfuser_option_keywords():
    cache = LRUCache(4)
    fec = cache.cache_compile(defined(relu_add).fusion)
    a, b = make((3, 3)), make((3, 3))
    out = fec.execute([a, b], _disable_options=["kernel_codegen"])[0]
    torch.testing.assert_close(out, torch.relu(a + b))
    assert all(r.runs_as == "aten" for r in fec.last_runtime.describe())
    assert fec.is_compiled([a, b]) is False  # only the kernel_codegen-disabled runtime exists
    fec.execute([a, b])
    assert fec.is_compiled([a, b]) is True


# --------------------------------------------------------------------------------------------------------------
# argument leniency: what pybind11 converts, nothing more


def test_ints_are_accepted_for_bool_parameters():
    x = make((6, 5))

    def fusion(flag):
        with FusionDefinition() as fd:
            t = fd.from_pytorch(x)
            fd.add_output(fd.ops.slice(t, [1, 0], [4, 5], manual_normalization=flag))
        return fd

    out0 = fusion(0).execute([x])[0]
    torch.testing.assert_close(out0, x[1:4])
    assert repr(fusion(0)) == repr(fusion(False))  # 0 is False, as pybind converts it
    assert repr(fusion(1)) == repr(fusion(True))
    with pytest.raises(FusionDtypeError, match="manual_normalization"):
        fusion(0.0)  # a float is not a bool
    with pytest.raises(FusionDtypeError, match="manual_normalization"):
        fusion("yes")


def test_define_scalar_dtype_first_and_ints_for_floats():
    with FusionDefinition() as fd:
        s = fd.define_scalar(DataType.Int)
        d = fd.define_scalar(2, dtype=DataType.Double)
        t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(fd.ops.mul(t, s), d))
    assert s.is_symbolic() and s.dtype is DataType.Int and s in fd.fusion.inputs()
    assert d.value == 2.0 and isinstance(d.value, float)
    x = make((4,))
    torch.testing.assert_close(fd.execute([3, x])[0], x * 3 * 2.0)
    with pytest.raises(FusionDtypeError):
        with FusionDefinition() as fd2:
            fd2.define_scalar("3")


def test_tensorview_exported_and_value_kind_queries():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1], contiguity=[True])
        s = fd.define_scalar(DataType.Double)
        fd.add_output(fd.ops.mul(t, s))
    assert pyfuser.TensorView is TensorView and isinstance(t, TensorView)
    assert t.is_tensor() and not t.is_scalar() and s.is_scalar() and not s.is_tensor()


# --------------------------------------------------------------------------------------------------------------
# validate / manual_validate / manual_execute


def test_validate_returns_outputs_and_takes_device():
    x = transposed((3, 4))
    fd = defined(lambda fd: fd.add_output(fd.ops.exp(fd.from_pytorch(x))))
    out = fd.validate([x], device=None)
    assert isinstance(out, list) and len(out) == 1
    torch.testing.assert_close(out[0], torch.exp(x))
    out2 = fd.validate([x], [torch.exp(x)])
    torch.testing.assert_close(out2[0], out[0])
    with pytest.raises(AssertionError, match="output 0"):
        fd.validate([x], [torch.exp(x) + 1])


def _expanded_input():
    """[4, 3, 5] with stride 0 on dims 0 and 1 (an input nvFuser declares with contiguity None and shape -1),
    read from an offset into a larger buffer, with special values."""
    base = torch.randn(12, device=DEVICE)
    base[3], base[4], base[5] = float("nan"), float("-inf"), -0.0
    return base[3:8].as_strided((4, 3, 5), (0, 0, 1), 3)


@pytest.mark.parametrize("neg_view", [False, True])
def test_validate_keeps_expanded_input_strides_for_the_reference(neg_view):
    x = _expanded_input()
    if neg_view:
        x = torch._neg_view(x)
    y = make((4, 3, 5))

    def fusion(fd):
        tx = fd.define_tensor(shape=[-1, -1, -1], contiguity=[None, None, True], dtype=DataType.Float)
        ty = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(fd.ops.mul(tx, ty), [0]))

    fd = defined(fusion)
    out = fd.validate([x, y])
    torch.testing.assert_close(out[0], (x * y).sum(0), equal_nan=True)
    assert x.stride() == (0, 0, 1)  # the caller's tensor is untouched


def test_reference_copies_keep_sizes_and_strides_and_own_their_memory():
    from pyfuser.frontend.validation import same_layout_copy

    for x in (_expanded_input(), transposed((3, 4))[1:], torch.randn(2, 1).expand(2, 6)[:, 1:4],
              torch._neg_view(torch.randn(3, 1).expand(3, 2)), torch.empty(0, 3).expand(2, 0, 3)):
        c = same_layout_copy(x)
        assert c.shape == x.shape and c.stride() == x.stride() and not c.is_neg()
        torch.testing.assert_close(c, x, equal_nan=True)
        if x.numel():
            assert c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_manual_validate_and_manual_execute_exclusive_with_execute():
    x = make((3, 4))
    x[0, 0] = float("nan")
    fd = defined(lambda fd: fd.add_output(fd.ops.tanh(fd.from_pytorch(x))))
    out = fd.manual_validate([x], [torch.tanh(x)])
    torch.testing.assert_close(out[0], torch.tanh(x), equal_nan=True)
    assert "ke" in vars(fd)
    with pytest.raises(AssertionError, match="KernelExecutor already exists"):
        fd.execute([x])
    fd2 = defined(lambda fd: fd.add_output(fd.ops.tanh(fd.from_pytorch(x))))
    fd2.execute([x])
    with pytest.raises(AssertionError, match="FusionExecutorCache already exists"):
        fd2.manual_execute([x])
    with pytest.raises(UnsupportedOpError, match="heuristic_params"):
        defined(lambda fd: fd.add_output(fd.ops.tanh(fd.from_pytorch(x)))).manual_execute([x], object())


# --------------------------------------------------------------------------------------------------------------
# introspection


def test_fusion_inputs_outputs_vals_and_print_math():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 4, 8])
        t1 = fd.define_tensor(shape=[2, 4, 8])
        t2 = fd.ops.add(t0, t1)
        fd.add_output(t2)
    f = fd.fusion
    assert f.inputs() == [t0, t1] and f.outputs() == [t2] and f.inputs == [t0, t1]
    assert f.vals() == [t0, t1, t2]
    assert f.print_math() == (
        "Inputs:\n"
        "  T0_g_float[iS0{2}, iS1{4}, iS2{8}]\n"
        "  T1_g_float[iS3{2}, iS4{4}, iS5{8}]\n"
        "Outputs:\n"
        "  T2_g_float[iS6{2}, iS7{4}, iS8{8}]\n"
        "\n"
        "%kernel_math {\n"
        "T2_g_float[iS6{2}, iS7{4}, iS8{8}]\n"
        "   = T0_g_float[iS0{2}, iS1{4}, iS2{8}]\n"
        "   + T1_g_float[iS3{2}, iS4{4}, iS5{8}];\n"
        "} // %kernel_math \n\n"
    )


def test_tensor_domain_prints_as_print_math_numbers_it():
    """nvFuser's ``tv.domain()``: during the definition, after execution, with reduction, broadcast and symbolic
    dims; the numbers are those of the fusion's ``print_math`` at the time of printing."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 4, 8])
        assert str(t0.domain()) == "[iS0{2}, iS1{4}, iS2{8}]"
        t1 = fd.define_tensor(shape=[2, 4, 8])
        t2 = fd.ops.add(t0, t1)
        s = fd.ops.sum(t2, [1])
        b = fd.ops.broadcast(s, [False, True, False])
        fd.add_output(t2)
        fd.add_output(b)
        sym = fd.define_tensor(shape=[-1, 1], contiguity=[True, None])
    fd.execute([make((2, 4, 8)), make((2, 4, 8)), make((3, 1))])
    assert str(t0.domain()) == "[iS0{2}, iS1{4}, iS2{8}]"
    assert str(t1.domain()) == "[iS3{2}, iS4{4}, iS5{8}]"
    assert str(t2.domain()) == repr(t2.domain()) == "[iS8{2}, iS9{4}, iS10{8}]"  # (inputs are numbered first)
    assert str(s.domain()) == "[iS11{2}, rS12{4}, iS13{8}]"
    assert str(b.domain()) == "[iS14{2}, bS15{1}, iS16{8}]"
    assert str(sym.domain()) == "[iS6{i6}, bS7{1}]"
    math = fd.fusion.print_math()
    for tv in (t0, t1, t2, s, b, sym):
        assert str(tv.domain()) in math


def test_val_and_expr_queries():
    """nvFuser's ``definition()``, ``uses()``, ``is_symbolic()`` on every kind of value, and ``Expr.input(i)`` /
    ``output(i)`` (an index out of range is an IndexError naming the expression)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[2, 4])
        c = fd.define_scalar(2.0)
        s = fd.define_scalar(dtype=DataType.Double)
        t1 = fd.ops.mul(t0, c)
        t2 = fd.ops.add(t1, s)
        t3 = fd.ops.sub(t2, t0)
        fd.add_output(t3)
        v_const, v_sym = fd.define_vector([2, 4]), fd.define_vector(2)
    assert t0.definition() is None and c.definition() is None
    mul, add, sub = t1.definition(), t2.definition(), t3.definition()
    assert (mul.input(0), mul.input(1), mul.output(0)) == (t0, c, t1)
    assert (sub.input(-1), sub.output(-1)) == (t0, t3)
    assert t0.uses() == [mul, sub] and t1.uses() == [add] and s.uses() == [add] and t3.uses() == []
    assert t0.is_symbolic() and t3.is_symbolic() and s.is_symbolic() and not c.is_symbolic()
    assert v_sym.is_symbolic() and not v_const.is_symbolic()
    for bad in (2, -3, "0"):
        with pytest.raises(IndexError, match=r"Expr.input\(.*T\d+ = add\(T\d+, S\d+\) has 2 inputs"):
            add.input(bad)
    with pytest.raises(IndexError, match="has 1 output$"):
        add.output(1)


def test_print_kernel_shows_generated_triton_source():
    x = make((4, 8))
    fd = defined(lambda fd: fd.add_output(fd.ops.mul(fd.ops.exp(fd.from_pytorch(x)), 2.0)))
    with pytest.raises(FusionDefinitionError, match="not been executed"):
        fd.fusion.print_kernel()
    fd.execute([x])
    text = fd.fusion.print_kernel()
    reports = fd.last_execution()
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":  # CI: the Triton interpreter
        assert reports[0].runs_as == "triton"
        assert reports[0].kernel_source in text and "@triton.jit" in text
        assert fd.fec.get_cuda_kernel([x]) == text
    else:  # no Triton here: the segment is named with how it ran
        assert "runs on aten" in text


# --------------------------------------------------------------------------------------------------------------
# version, repro scripts, profiler


def test_version_is_the_nvfuser_api_level():
    v = version()
    assert v >= "0.2.34" and v > "0.0.0" and v < "1.0.0" and v == pyfuser.frontend.version.NVFUSER_API_VERSION
    assert v > "0.2.8+git1234abc"
    assert pyfuser.__version__ == "0.1.0" and pyfuser.__version__ != v
    with pytest.raises(ValueError):
        pyfuser.frontend.version.Version("not a version")


def test_repro_scripts_rebuild_and_run(monkeypatch):
    x, y = make((2, 3)), transposed((2, 3))
    fd = defined(lambda fd: fd.add_output(fd.ops.mul(fd.ops.add(fd.from_pytorch(x), fd.from_pytorch(y)), 3.0)))
    without = fd.repro_script_for()
    assert "inputs = [" not in without and "tv2 = fd.ops.mul(tv2, 3.00000)" not in without
    assert "    tv3 = fd.ops.mul(tv2, 3.00000)\n" in without
    with pytest.raises(AssertionError, match="save_repro_inputs=True"):
        fd.last_repro_script()
    fd.execute([x, y, ], save_repro_inputs=True)
    script = fd.last_repro_script()
    assert script == fd.repro_script_for([x, y])
    assert f"torch.testing.make_tensor((2, 3), dtype=torch.float32, device='{x.device}')" in script
    assert f"torch.randn(6, dtype=torch.float32, device='{y.device}').as_strided((2, 3), (1, 2))" in script
    for name in ("nvfuser_direct", "nvfuser_direct.pytorch_utils", "nvfuser_direct.nvfuser_direct_version", "nvfuser"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    pyfuser.register_as_nvfuser_direct(legacy_name=False)
    scope: dict = {}
    exec(script, scope)
    out = scope["fd"].execute(scope["inputs"])[0]
    assert out.shape == (2, 3) and out.dtype == torch.float32


def test_python_profiler_sees_a_cached_call():
    """fd.execute's common call goes straight to the executor cache only while no profiler listens: a cached
    fusion called again under a profiler is reported, and its outputs equal eager's (values, shape, strides)."""
    a, b = make((4, 6)), make((6, 4)).t()
    fd = defined(lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(a), fd.from_pytorch(b))))
    fd.execute([a, b])
    with PythonProfiler() as prof:
        (out,) = fd.execute([a, b])
    assert prof.profile.segments == len(fd.last_execution()) >= 1
    want = a * b
    assert out.shape == want.shape and out.dtype == want.dtype and out.stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_python_profiler_reports_segments():
    a, b = make((2, 5)), make((2, 5))

    def fusion(fd):
        t = fd.ops.add(fd.from_pytorch(a), fd.from_pytorch(b))
        fd.add_output(fd.ops.sum(fd.ops.sum(t, dims=[-1]), dims=[-1]))

    fd = defined(fusion)
    with PythonProfiler() as prof:
        fd.execute([a, b])
    segs = fd.last_execution()
    assert prof.profile.segments == len(segs) == len(prof.profile.kernel_profiles)
    for k, r in zip(prof.profile.kernel_profiles, segs):
        assert k.scheduler == r.kind and k.segment_id == r.index and len(k.name) > 0
        assert k.name == (r.kernel_name or "aten:" + ",".join(r.ops))
        assert k.input_bytes > 0
        if torch.cuda.is_available():  # device times from torch.profiler, and the share of copy bandwidth
            assert k.time_ms is not None and k.time_ms > 0 and k.kernel_names, k
            assert 0 < k.percentage_peak_bandwidth < 150, k
        else:
            assert k.time_ms is None
    if torch.cuda.is_available():
        assert prof.profile.time_ms == pytest.approx(sum(k.time_ms for k in prof.profile.kernel_profiles))
    fd2 = defined(lambda fd: fd.add_output(fd.ops.add(fd.from_pytorch(a), fd.from_pytorch(b))))
    with PythonProfiler(auto_scheduled=False) as prof2:
        fd2.manual_execute([a, b])
    assert prof2.profile.fusion_id >= 0 and prof2.profile.kernel_profiles[0].scheduler == "user"



def test_reports_and_profiler_count_tensors_only():
    """A segment's scalar inputs have no layout: `last_execution()` lists only its tensors, with their layouts,
    and the profiler's bytes are the tensors' bytes (a transposed input counts its elements, not its strides)."""
    a = transposed((6, 5), torch.float32)

    def fusion(fd):
        t = fd.from_pytorch(a)
        s = fd.define_scalar(DataType.Double)
        fd.add_output(fd.ops.mul(t, s))

    fd = defined(fusion)
    fd.execute([a, 2.0])
    with PythonProfiler() as prof:
        (out,) = fd.execute([a, 2.0])
    want = a * 2.0
    assert out.shape == want.shape and out.dtype == want.dtype and out.stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    (report,) = fd.last_execution()
    t_in, t_out = fd.fusion.inputs()[0], fd.fusion.outputs()[0]
    assert list(report.inputs) == [t_in.name] and list(report.outputs) == [t_out.name]
    assert tuple(report.inputs[t_in.name].sizes) == (6, 5)
    (k,) = prof.profile.kernel_profiles
    assert k.input_bytes == a.numel() * 4 and k.output_bytes == out.numel() * 4


# --------------------------------------------------------------------------------------------------------------
# repr in nvFuser's printer style


def test_repr_matches_nvfuser_printer_and_round_trips():
    x = make((2, 4, 8))

    def fusion(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(x)
        c0 = fd.define_scalar(3.0)
        t3 = fd.ops.mul(fd.ops.add(t0, t1), c0)
        fd.add_output(fd.ops.sum(t3, [-1], False, DataType.Float))

    fd = defined(fusion)
    assert repr(fd) == (
        "def nvfuser_fusion(fd : FusionDefinition) -> None :\n"
        "    tv0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False)\n"
        "    tv1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False)\n"
        "    tv2 = fd.ops.add(tv0, tv1)\n"
        "    tv3 = fd.ops.mul(tv2, 3.00000)\n"
        "    tv4 = fd.ops.sum(tv3, dims=[2], dtype=DataType.Float)\n"
        "    fd.add_output(tv4)\n"
    )
    scope = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(repr(fd), scope)
    fd2 = defined(scope["nvfuser_fusion"])
    assert repr(fd2) == repr(fd) and fd2.fusion == fd.fusion
    assert torch.equal(fd.execute([x, x])[0], fd2.execute([x, x])[0])


def test_repr_key_keeps_constant_dtypes_and_symbolic_scalars_apart():
    def with_const(dtype):
        def fusion(fd):
            t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
            fd.add_output(fd.ops.mul(t, fd.define_scalar(2.0, dtype=dtype)))
        return defined(fusion)

    double, flt = with_const(DataType.Double), with_const(DataType.Float)
    assert "fd.ops.mul(tv0, 2.00000)" in repr(double)
    assert "c0 = fd.define_scalar(2.00000, dtype=DataType.Float)" in repr(flt)  # not a Python literal's dtype
    cache = LRUCache(4)
    cache.cache_compile(double.fusion)
    cache.cache_compile(flt.fusion)
    assert cache.num_fusions() == 2

    def symbolic(fd):
        t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t, fd.define_scalar(None, dtype=DataType.Double)))

    assert "c0 = fd.define_scalar(None, dtype=DataType.Double)" in repr(defined(symbolic))
    cache.cache_compile(defined(symbolic).fusion)
    assert cache.num_fusions() == 3


def test_repr_names_do_not_depend_on_earlier_definitions():
    first = repr(defined(relu_add))
    defined(sub_bcast)
    assert repr(defined(relu_add)) == first and "tv0" in first


# --------------------------------------------------------------------------------------------------------------
# out of scope: manual scheduling raises our error, never AttributeError


def test_scheduling_api_raises_unsupported_op_error():
    fd = defined(relu_add)
    t = fd.fusion.inputs[0]
    with pytest.raises(UnsupportedOpError, match="fd.sched.split"):
        fd.sched.split(t, 0, 4)
    for name in ("merge", "parallelize", "cache_after"):
        with pytest.raises(UnsupportedOpError, match=f"TensorView.{name}"):
            getattr(t, name)(0)
    # split/axis are the sharding API (tests/test_multidevice.py): thread parallel types stay unsupported.
    with pytest.raises(UnsupportedOpError, match="parallelize.block_x.*no manual scheduling"):
        t.axis(0).parallelize(pyfuser.ParallelType.block_x)
    with pytest.raises(UnsupportedOpError, match="FusionDefinition.schedule"):
        fd.schedule()
    fec = LRUCache(2).cache_compile(fd.fusion)
    with pytest.raises(UnsupportedOpError, match="get_scheduled_ir"):
        fec.get_scheduled_ir([])
    with pytest.raises(AttributeError):
        fd.no_such_attribute  # noqa: B018 -- unknown names stay AttributeErrors


# --------------------------------------------------------------------------------------------------------------
# module names clients import


def test_register_as_nvfuser_direct(monkeypatch):
    for name in ("nvfuser_direct", "nvfuser_direct.pytorch_utils", "nvfuser_direct.nvfuser_direct_version", "nvfuser"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert pyfuser.register_as_nvfuser_direct() is pyfuser
    import nvfuser_direct
    from nvfuser_direct import DataType as DT, FusionDefinition as FD, ParallelType, execute_with_dtensors, multidevice
    from nvfuser_direct.nvfuser_direct_version import Version
    from nvfuser_direct.pytorch_utils import torch_dtype_to_nvfuser_dtype

    assert nvfuser_direct is pyfuser and FD is FusionDefinition and DT is DataType
    assert nvfuser_direct.version() > Version("0.2.33") and torch_dtype_to_nvfuser_dtype(torch.bfloat16) is DT.BFloat16
    assert ParallelType.mesh_x.name == "mesh_x" and multidevice.DeviceMesh([0]).size == 1
    assert callable(execute_with_dtensors)
    import nvfuser  # Thunder imports compute_tensor_descriptor from the legacy name

    assert nvfuser.compute_tensor_descriptor([2, 3], [3, 1]) == ([True, True], [1, 0])
    assert pyfuser.register_as_nvfuser_direct() is pyfuser  # idempotent


def test_execute_with_dtensors_runs_plain_tensors_and_dtensors():
    a, b = make((2, 3)), make((2, 3))
    fd = defined(lambda fd: fd.add_output(fd.ops.add(fd.from_pytorch(a), fd.from_pytorch(b))))
    torch.testing.assert_close(pyfuser.execute_with_dtensors(fd, [a, b])[0], a + b)
    with pytest.raises(UnsupportedOpError, match="multidevice.Sharding"):
        pyfuser.multidevice.Sharding()
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without distributed")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    a, b = a.cpu(), b.cpu()  # a CPU (gloo) mesh holds CPU shards
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        da = DTensor.from_local(a, mesh, [Replicate()])
        (out,) = pyfuser.execute_with_dtensors(fd, [da, b])  # multi-device runs: tests/test_multidevice.py
        assert isinstance(out, DTensor) and out.placements == (Replicate(),)
        torch.testing.assert_close(out.to_local(), a + b)
    finally:
        dist.destroy_process_group()


def test_validate_tolerances_follow_dtype_and_reduction_size():
    from pyfuser.frontend.validation import reference_run, tolerance

    x, w = make((6, 1000)), make((1000, 3))

    def fusion(fd):
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.exp(tx))                                  # no reduction
        fd.add_output(fd.ops.mul(fd.ops.sum(tx, dims=[1]), 2.0))        # a 1000-element sum upstream
        fd.add_output(fd.ops.relu(fd.ops.matmul(tx, tw)))              # K = 1000
        fd.add_output(fd.ops.cast(fd.ops.sum(tx, dims=[0, 1]), DataType.BFloat16))  # 6000 elements, bf16

    fd = defined(fusion)
    refs, sizes = reference_run(fd.fusion, [x, w])
    assert sizes == [1, 1000, 1000, 6000] and len(refs) == 4
    assert tolerance(torch.float32, 1) == (1.68222e-06, 2.23704e-06)
    assert tolerance(torch.float32, 1000) == (5.78476e-05, 5.78476e-07)  # next entry up (2048)
    # 8192 covers 6000, the next entry up is 16384's; BFloat16 gets ten times Half's tolerances, as in nvFuser
    assert tolerance(torch.bfloat16, 6000) == (0.250049 * 10, 0.250049 * 0.01 * 10)
    assert tolerance(torch.float16, 6000) == (0.250049, 0.250049 * 0.01)
    assert tolerance(torch.bfloat16, 1) == (0.00390625, 0.0078125)  # no reduction: not scaled
    assert tolerance(torch.float32, 10**8) == (0.00343043 * 2, 0.00343043 * 2 * 0.01)
    assert tolerance(torch.int64, 50) == (0.0, 0.0)
    outs = fd.validate([x, w])
    assert [o.shape for o in outs] == [(6, 1000), (6,), (6, 3), ()]
    with pytest.raises(AssertionError, match="output 1"):
        fd.validate([x, w], [refs[0], refs[1] + 1e-3, refs[2], refs[3]])  # beyond 5.8e-5 + 5.8e-7 * |ref|
    fd.validate([x, w], [refs[0], refs[1] + 1e-5, refs[2], refs[3]])      # within


def test_validate_reduction_sizes_multiply_along_chains():
    # nvFuser's validator multiplies the reduced extents along a chain of reductions (a sum of 16 products of
    # a 32-element matmul K counts 512), keeps the largest of several operands, and counts a scan's dim.
    from pyfuser.frontend.validation import reference_run

    a, b, v = make((16, 32)), make((32, 8)), make((5, 7))

    def fusion(fd):
        ta, tb, tv = fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(v)
        m = fd.ops.matmul(ta, tb)                                        # K = 32
        s = fd.ops.sum(m, dims=[0])                                      # 16 more: 512
        fd.add_output(fd.ops.cast(s, DataType.BFloat16))
        fd.add_output(fd.ops.add(fd.ops.sum(tv, dims=[1]), fd.ops.sum(tv, dims=[1])))  # max(7, 7), not 49
        fd.add_output(fd.ops.sum(fd.ops.cumsum(tv, 1), dims=[0]))       # 7 * 5
        fd.add_output(fd.ops.sum(fd.ops.sum(tv, dims=[1]), dims=[0]))   # 7 * 5

    fd = defined(fusion)
    _, sizes = reference_run(fd.fusion, [a, b, v])
    assert sizes == [512, 7, 35, 35]
    outs = fd.validate([a, b, v])
    assert outs[0].dtype == torch.bfloat16 and outs[0].shape == (8,)
