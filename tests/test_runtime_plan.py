"""The lean runtime (docs/runtime.md): flat plans, the one launcher, CUDA graphs, device-side offset checks.

CPU tests run everywhere (kernels under the Triton interpreter); tests marked ``gpu`` need CUDA: the direct
launch path, CUDA graphs and deferred device errors exist only there.
"""

from __future__ import annotations

import threading

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import launcher
from pyfuser.errors import FusionExecutionError, InputTypeError, OptionError
from pyfuser.runtime import evaluator
from pyfuser.runtime.steps import CallStep, KernelStep

from harness import DEVICE, make

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _pointwise(fd):
    x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
    y = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
    fd.add_output(fd.ops.mul(fd.ops.relu(fd.ops.add(x, y)), 2.0))


def _three_segments(fd):
    t = fd.define_tensor([-1], contiguity=[True])
    m = fd.define_tensor([-1, -1], contiguity=[True, True])
    fd.add_output(fd.ops.mul(fd.ops.matmul(m, fd.ops.exp(t)), 2.0))


def _build(fn):
    with FusionDefinition() as fd:
        fn(fd)
    return fd


def test_cached_call_runs_the_flat_plan_without_the_ir_evaluator(monkeypatch):
    """A cached call never resolves IR values: the reference evaluator's resolver is not reached."""
    fd = _build(_three_segments)
    t, m = make([8]), make([4, 8])
    expected = (m @ torch.exp(t)) * 2.0
    torch.testing.assert_close(fd.execute([t, m])[0], expected)

    def forbidden(*a, **k):
        raise AssertionError("a cached call walked the IR")

    monkeypatch.setattr(evaluator, "resolve", forbidden)
    monkeypatch.setattr(evaluator.Env, "value", forbidden)
    torch.testing.assert_close(fd.execute([t, m])[0], expected)
    steps = fd.last_runtime().plan.steps
    assert {type(s) for s in steps} <= {CallStep, KernelStep}
    assert [r.runs_as for r in fd.last_execution()] == (
        ["triton", "aten", "triton"] if launcher.triton_usable(DEVICE) else ["aten", "aten", "aten"])


def test_every_step_reports_itself():
    fd = _build(_three_segments)
    fd.execute([make([8]), make([4, 8])])
    reports = fd.last_execution()
    for report in reports:
        assert report.steps, f"segment {report.index} reports no steps"
        for step in report.steps:
            assert step.kind in ("aten", "triton", "op kernel")
            if step.kind == "triton":
                assert step.source and step.name == report.kernel_name
            else:
                assert step.name in report.ops
    assert reports[1].steps[0].reason == "ExprEval segment"
    assert "  step aten: matmul (ExprEval segment)" in str(reports[1]).splitlines()


def test_negative_bit_inputs_are_resolved_and_keyed():
    fd = _build(_pointwise)
    x, y = make([4, 6]), make([4, 6])
    plain = fd.execute([x, y])[0]
    neg = torch._neg_view(-x)  # the same values as x, stored negated with the negative bit set
    assert neg.is_neg() and torch.equal(neg, x)
    out = fd.execute([neg, y])[0]
    assert torch.equal(out, plain)
    assert fd._executor.num_runtimes() == 2, "the negative bit must be part of the input signature"


def test_nested_list_only_stands_for_vector_scalars():
    fd = _build(_pointwise)
    x = make([2, 3])
    with pytest.raises(InputTypeError, match=r"input 0 \(T0\): a nested list"):
        fd.execute([[x, x]])
    with FusionDefinition() as fd2:  # define_vector(n): n Int inputs bound from one list
        t = fd2.define_tensor([-1], contiguity=[True])
        v = fd2.define_vector(2)
        fd2.add_output(fd2.ops.reshape(t, v))
    out = fd2.execute([make([6]), [2, 3]])[0]
    assert out.shape == (2, 3)


def test_alias_into_an_expanded_input_is_our_error():
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=[None, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t, 1.0), alias_input=t)
    x = make([1, 4]).expand(3, 4)
    with pytest.raises(FusionExecutionError, match=r"cannot write into input T0 \(sizes \[3, 4\], strides \[0, 1\]\)"):
        fd.execute([x])


def test_upstream_option_names_are_accepted_and_ours_are_checked():
    fd = _build(_pointwise)
    x, y = make([2, 3]), make([2, 3])
    ref = fd.execute([x, y])[0]
    out = fd.execute([x, y], _enable_options=["host_ir_lowering", "fuse_matmul"],
                     _disable_options=["matmul_expr_eval", "resize_scheduler"])[0]
    assert torch.equal(out, ref)
    with pytest.raises(Exception, match="unknown enable option 'no_such_option'"):
        fd.execute([x, y], _enable_options=["no_such_option"])


@pytest.mark.skipif(CUDA, reason="the CPU refusal")
def test_cuda_graph_needs_cuda():
    fd = _build(_pointwise)
    with pytest.raises(OptionError, match="cuda_graph: CUDA graphs need a CUDA device"):
        fd.execute([make([2, 3]), make([2, 3])], _enable_options=["cuda_graph"])


def test_interpreted_launches_are_thread_safe():
    """Every thread's result is checked and every thread's exception fails the test."""
    fd = _build(_pointwise)
    inputs = [(make([8, 16]), make([8, 16])) for _ in range(4)]
    expected = [torch.relu(a + b) * 2.0 for a, b in inputs]
    fd.execute(list(inputs[0]))
    errors, results = [], {}

    def work(i):
        try:
            for _ in range(3):
                results[i] = fd.execute(list(inputs[i]))[0]
                assert torch.equal(results[i], expected[i])
        except BaseException as e:  # noqa: BLE001 (reported below, so the test fails)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 4


def test_offset_checks_on_cpu_raise_at_once():
    """Off CUDA, offset values are read directly (no synchronization to avoid): the call itself raises."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        b = fd.define_tensor([-1, -1, -1], dtype=DataType.BFloat16)
        o = fd.define_tensor([-1], dtype=DataType.Int32)
        fd.add_output(fd.ops.grouped_mm(a, b, o))
    a_t = torch.randn(10, 32, dtype=torch.bfloat16)
    b_t = torch.randn(3, 32, 24, dtype=torch.bfloat16)
    with pytest.raises(FusionExecutionError, match=r"grouped_mm: offsets must be non-decreasing cumulative group ends"
                       r".*got \[5, 2, 10\]"):
        fd.execute([a_t, b_t, torch.tensor([5, 2, 10], dtype=torch.int32)])


# --------------------------------------------------------------------------------------------------------------
# GPU: the direct launch path, CUDA graphs, deferred device errors, no host syncs


def _count_jit_dispatches(monkeypatch) -> dict:
    """Count calls of Triton's JIT dispatch (JITFunction.run) itself, not pyfuser's own counters."""
    from triton.runtime.jit import JITFunction

    seen = {"n": 0}
    original = JITFunction.run

    def counting(self, *args, **kwargs):
        seen["n"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counting)
    return seen


def _gemm_fusion_and_inputs():
    """The NVFP4 grouped GEMM as a fusion, good inputs, and inputs whose expert offsets decrease."""
    from nvfp4_inputs import gemm_fusion, gemm_inputs

    fd = gemm_fusion()
    g = gemm_inputs(96, 128, 64, [20, 33, 0, 43], DEVICE)
    good = g.as_list()
    bad = list(good)
    bad[6] = torch.tensor([0, 53, 20, 53], dtype=torch.int32, device=DEVICE)  # decreasing starts
    return fd, good, bad


def _moe_layer():
    from pyfuser.demo import moe_nvfp4 as moe

    cfg = moe.MoEConfig(hidden=256, intermediate=128, experts=4, top_k=2)
    return moe.MoENVFP4(cfg, moe.quantize_weights(moe.make_weights(cfg, DEVICE))), cfg


@gpu
def test_cached_calls_never_reach_triton_jit_dispatch(monkeypatch):
    fds = [(_build(_pointwise), [make([64, 96]), make([64, 96])]), (_build(_three_segments), [make([64]),
                                                                                                make([32, 64])])]
    layer, cfg = _moe_layer()
    x = torch.randn(16, cfg.hidden, device=DEVICE, dtype=torch.bfloat16)
    for fd, inputs in fds:
        fd.execute(inputs)
    layer(x)
    seen = _count_jit_dispatches(monkeypatch)
    for _ in range(3):
        for fd, inputs in fds:
            fd.execute(inputs)
        layer(x)
    torch.cuda.synchronize()
    assert seen["n"] == 0, f"{seen['n']} cached launches went through Triton's JIT dispatch"


@gpu
def test_launch_hooks_take_the_jit_path_and_still_see_every_launch(monkeypatch):
    from triton import knobs

    fd = _build(_pointwise)
    x, y = make([64, 96]), make([64, 96])
    ref = fd.execute([x, y])[0]
    fd.execute([x, y])
    calls = []
    knobs.runtime.launch_enter_hook.add(lambda metadata: calls.append(metadata))
    try:
        seen = _count_jit_dispatches(monkeypatch)
        out = fd.execute([x, y])[0]
    finally:
        knobs.runtime.launch_enter_hook.remove(knobs.runtime.launch_enter_hook.calls[-1])
    assert torch.equal(out, ref)
    assert len(calls) == 1 and seen["n"] == 1


@gpu
def test_default_path_never_synchronizes():
    """torch's sync debug mode raises on any host synchronization (device-to-host copies, .item(), ...)."""
    layer, cfg = _moe_layer()
    x = torch.randn(16, cfg.hidden, device=DEVICE, dtype=torch.bfloat16)
    fd = _build(_three_segments)
    t, m = make([64]), make([32, 64])
    layer(x)
    fd.execute([t, m])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x)
        fd.execute([t, m])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
def test_invalid_offsets_are_reported_by_a_later_call():
    fd, good, bad = _gemm_fusion_and_inputs()
    fd.execute(good)
    fd.execute(bad)  # the device check flags it without stalling this call
    torch.cuda.synchronize()
    with pytest.raises(FusionExecutionError, match=r"cutlass_nvfp4_grouped_mm: expert_offsets must be non-decreasing"):
        fd.execute(good)
    fd.execute(good)  # reported once, then the flags are clear
    with pytest.raises(FusionExecutionError, match=r"expert_offsets must be non-decreasing start rows in \[0, \d+\], "
                       r"got \["):
        fd.execute(bad, _enable_options=["sync_offset_checks"])


@gpu
def test_cuda_graph_replays_equal_execute_bit_for_bit():
    fd = _build(_three_segments)
    layer, cfg = _moe_layer()
    weights_before = [t.data_ptr() for t in layer.inputs(torch.empty(1, cfg.hidden, device=DEVICE,
                                                                     dtype=torch.bfloat16))[1:]]
    outs = []
    for i in range(5):  # new values AND new addresses every call
        t, m = make([64]), make([32, 64])
        x = torch.randn(16, cfg.hidden, device=DEVICE, dtype=torch.bfloat16)
        plain = fd.execute([t, m])[0]
        graphed = fd.execute([t, m], _enable_options=["cuda_graph"])[0]
        assert torch.equal(graphed, plain)
        assert graphed.stride() == plain.stride() and graphed.dtype == plain.dtype
        ref = layer(x)
        (g,) = layer.fusion(16).execute(layer.inputs(x), _enable_options=["cuda_graph"])
        assert torch.equal(g, ref) and g.stride() == ref.stride() and g.dtype == ref.dtype
        outs.append((graphed, graphed.clone()))
    for kept, copy in outs:  # a later replay never overwrote an earlier call's output
        assert torch.equal(kept, copy)
    runtime = layer.fusion(16)._executor.last_runtime
    assert runtime.graphed.captures == 1, "weights never move: one capture, read in place"
    assert weights_before == [t.data_ptr() for t in layer.inputs(x)[1:]]


@gpu
def test_cuda_graph_refuses_a_host_sync_naming_the_op():
    fd, good, _ = _gemm_fusion_and_inputs()
    opts = ["cuda_graph", "sync_offset_checks"]
    fd.execute(good, _enable_options=opts)  # first call: plain
    with pytest.raises(FusionExecutionError, match=r"cuda_graph: fd.ops.cutlass_nvfp4_grouped_mm cannot be captured"):
        fd.execute(good, _enable_options=opts)
    out = fd.execute(good)[0]  # the fusion still works without graphs
    assert out.isfinite().all()


# --------------------------------------------------------------------------------------------------------------
# compiled kernels are owned by the caches that use them


def _distinct_fusion(i: int):
    """A fusion whose generated kernel differs from every other i's (the constant is part of the source)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.mul(t, float(i) + 0.5), 1.0))
    return fd


def _kernel_files() -> int:
    import os

    from pyfuser.codegen import compiler

    return len([f for f in os.listdir(compiler.kernel_folder()) if f.endswith(".py")])


def _check_bounded(n: int, cache_size: int) -> None:
    import gc

    from pyfuser import LRUCache
    from pyfuser.codegen import compiler

    if not launcher.triton_usable(DEVICE):
        pytest.skip("no generated kernels here")
    x = make([8])
    gc.collect()
    base_kernels, base_files = compiler.live_kernels(), _kernel_files()
    cache = LRUCache(max_fusions=cache_size)
    peak = 0
    for i in range(n):
        fd = _distinct_fusion(i)
        fd.fec = cache.cache_compile(fd.fusion)
        torch.testing.assert_close(fd.execute([x])[0], x * (float(i) + 0.5) + 1.0)
        del fd
        if i % 50 == 49:
            gc.collect()
            peak = max(peak, compiler.live_kernels() - base_kernels)
    gc.collect()
    live = compiler.live_kernels() - base_kernels
    assert peak <= cache_size + 50 and live <= cache_size, (peak, live)
    assert _kernel_files() - base_files <= cache_size
    del cache
    gc.collect()
    assert compiler.live_kernels() <= base_kernels and _kernel_files() <= base_files


def test_compiled_kernels_are_freed_with_their_caches():
    _check_bounded(60, 5)


@pytest.mark.slow
@pytest.mark.skipif(__import__("os").environ.get("PYFUSER_SLOW_TESTS") != "1",
                    reason="about 2.5 minutes; PYFUSER_SLOW_TESTS=1 runs it")
def test_ten_thousand_distinct_fusions_stay_bounded():
    _check_bounded(10_000, 10)


def test_first_call_logs_what_it_prepares_and_compiles(caplog):
    """A user waiting on a first call sees why at INFO on the 'pyfuser' logger."""
    import logging

    fd = _distinct_fusion(123456)
    with caplog.at_level(logging.INFO, logger="pyfuser"):
        fd.execute([make([8])])
    text = caplog.text
    assert "prepared a runtime for a new input signature in" in text
    if launcher.triton_usable(DEVICE):
        assert "generated kernel pf_" in text and "loaded in" in text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyfuser"):
        fd.execute([make([8])])
    assert "prepared" not in caplog.text, "a cached call logs nothing"


def test_output_also_written_into_an_input_is_that_input():
    """add_output(out) and add_output(out, alias_input=t): the returned output is t itself, holding out's value
    (nvFuser returns the same buffer); the input added plainly is returned as itself too."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
        out = fd.ops.where(fd.ops.gt(t, 0.0), t, 0.0)
        fd.add_output(out)
        fd.add_output(out, alias_input=t)
        fd.add_output(out)
        fd.add_output(t)
    x = make([3, 4]) - 0.5
    expected = torch.where(x > 0, x, 0.0)
    outs = fd.execute([x])
    assert len(outs) == 3
    for o in outs:
        assert o.data_ptr() == x.data_ptr()
        assert torch.equal(o, expected)


@pytest.mark.parametrize("view", ["neg_view", "transposed_neg_view"])
def test_hand_written_kernel_reads_negative_bit_inputs_resolved(view):
    """A hand-written kernel (nv_block_quantize) reads raw memory too: a negative-bit input (contiguous or not)
    gives exactly the bits of the same values passed plainly, and the caller's view is left as it was."""
    from pyfuser.nvfp4 import reference as ref

    x = torch.randn(32, 64) * 3
    if view == "transposed_neg_view":
        x = x.t().contiguous().t()  # column-major storage
    x = x.to(DEVICE)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.Float, stride_order=[0, 1] if x.stride(0) == 1 else [])
        q, s = fd.ops.nv_block_quantize(t)
        fd.add_output(q)
        fd.add_output(s)
    neg = torch._neg_view(-x)
    assert neg.is_neg() and torch.equal(neg, x) and neg.stride() == x.stride()
    outs = fd.execute([neg])
    data, scales = ref.quantize_nvfp4_fused(x, None)
    assert outs[0].dtype == torch.float4_e2m1fn_x2 and outs[0].shape == (32, 32)
    assert torch.equal(outs[0].view(torch.uint8), data.view(torch.uint8))
    assert outs[1].dtype == torch.float8_e4m3fn and outs[1].shape == (32, 4) and outs[1].stride() == scales.stride()
    assert torch.equal(outs[1].view(torch.uint8), scales.view(torch.uint8))
    assert neg.is_neg() and torch.equal(neg, x)
    assert [r.runs_as for r in fd.last_execution()] == (
        ["op kernel"] if launcher.triton_usable(DEVICE) else ["aten"])


@gpu
def test_explicit_bare_cuda_device_runs_kernels():
    """execute(device="cuda") (no index): streams and allocations use the current device's index."""
    fd = _build(_pointwise)
    x, y = make([64, 96]), make([64, 96])
    ref = torch.relu(x + y) * 2.0
    for _ in range(2):  # a plain call, then a cached one (the direct launch path)
        out = fd.execute([x, y], device="cuda")[0]
        assert torch.equal(out, ref) and out.stride() == ref.stride() and out.dtype == ref.dtype
