"""Prepared op kernels (``OpDef.prepare``, docs/runtime.md "Prepared op kernels").

The NVFP4 ops' hand-written kernels check shapes and dtypes and work out their launches once per input signature,
when the plan's first call runs; a cached call only allocates, checks offset values, binds pointers and launches.
These tests hold the prepared path to the unprepared one (every call checking and configuring anew): the same
values, shapes, dtypes, strides and storages, call after call with new values; a new signature prepares again; bad
metadata on a new signature raises pyfuser's own error, every time; what a signature does not fix (scale1's
storage) is still checked per call; and the device-side offset checks, run here on CPU tensors under the Triton
interpreter, report from a later call as on CUDA.
"""

from __future__ import annotations

import collections

import pytest
import torch

from harness import DEVICE
from nvfp4_inputs import gemm_fusion, gemm_inputs, start_offsets
from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.launcher import triton_usable
from pyfuser.errors import FusionExecutionError
from pyfuser.nvfp4 import reference as ref
from pyfuser.ops import narrow_precision, registry
from pyfuser.runtime import fusion_runtime

pytestmark = pytest.mark.skipif(not triton_usable(DEVICE), reason="hand-written kernels need Triton")

LAYOUT, QUANT, GROUPED, GEMM = ("preprocess_grouped_matmul_input_sf", "nv_block_quantize",
                                "nv_grouped_block_quantize", "cutlass_nvfp4_grouped_mm")


@pytest.fixture
def prepares(monkeypatch) -> collections.Counter:
    """How many times each op's kernel was prepared (fusions built after the fixture count)."""
    counts: collections.Counter = collections.Counter()
    for name in (LAYOUT, QUANT, GROUPED, GEMM):
        opdef = registry.get(name)

        def counting(node, *args, _prepare=opdef.prepare, **kwargs):
            counts[node.op.name] += 1
            return _prepare(node, *args, **kwargs)

        monkeypatch.setattr(opdef, "prepare", counting)
    return counts


def unprepared(monkeypatch, name: str) -> None:
    """Fusions built from now on run the op's kernel unprepared: every call checks and configures anew."""
    monkeypatch.setattr(registry.get(name), "prepare", None)


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the tensor's storage (the swizzled scale results keep their data outside the logical view)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def assert_identical(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == (b.dtype, b.shape, b.stride(), b.storage_offset())
        assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
        assert torch.equal(_storage_bytes(a), _storage_bytes(b))


def _i32(v):
    return torch.tensor(v, dtype=torch.int32, device=DEVICE)


# --------------------------------------------------------------------------------------------------------------
# fusions of one op each, and inputs of one signature with new values per seed


def _offsets_inputs(tokens):
    starts, sf = start_offsets(tokens, DEVICE)
    return starts, sf


def layout_case():
    def define():
        with FusionDefinition() as fd:
            x = fd.from_pytorch(inputs(0)[0])  # column-major: the kernel reads it element by element
            a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
            b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
            fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(x, a, b))
        return fd

    def inputs(seed, m=40, tokens=(7, 0, 33)):
        gen = torch.Generator().manual_seed(seed)
        x = (torch.rand(6, m, generator=gen) * 300 + 1).to(torch.float8_e4m3fn).to(DEVICE).t()
        return [x, *_offsets_inputs(tokens)]

    return LAYOUT, define, inputs


def quantize_case(swizzle: bool):
    def define():
        with FusionDefinition() as fd:
            x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
            gs = fd.define_tensor(shape=[], dtype=DataType.Float)
            q, s = fd.ops.nv_block_quantize(x, gs, swizzle_block_scales=swizzle)
            fd.add_output(q)
            fd.add_output(s)
        return fd

    def inputs(seed, m=24, k=64):
        gen = torch.Generator().manual_seed(seed)
        return [(torch.randn(m, k, generator=gen) * 5).to(torch.bfloat16).to(DEVICE),
                torch.tensor(2.0 + seed, device=DEVICE)]

    return QUANT, define, inputs


def grouped_quantize_case():
    def define():
        with FusionDefinition() as fd:
            x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
            a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
            b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
            q, s = fd.ops.nv_grouped_block_quantize(x, a, b)
            fd.add_output(q)
            fd.add_output(s)
        return fd

    def inputs(seed, tokens=(5, 19, 0)):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(sum(tokens), 48, generator=gen).to(DEVICE) * 3
        return [x, *_offsets_inputs(tokens)]

    return GROUPED, define, inputs


def gemm_case():
    def inputs(seed, tokens=(12, 20)):
        return gemm_inputs(sum(tokens), 128, 64, list(tokens), DEVICE, seed=seed).as_list()

    return GEMM, gemm_fusion, inputs


CASES = {
    "layout op": layout_case,
    "block quantize": lambda: quantize_case(False),
    "block quantize, swizzled": lambda: quantize_case(True),
    "grouped quantize": grouped_quantize_case,
    "grouped GEMM": gemm_case,
}


# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_prepared_calls_equal_unprepared_calls(case, prepares, monkeypatch):
    """Call after call with new values (one signature), the prepared kernel gives exactly what the kernel run
    unprepared gives: values (every byte of the storage), shapes, dtypes, strides, storage sizes."""
    name, define, inputs = CASES[case]()
    prepared = define()
    for seed in range(3):
        prepared.execute(inputs(seed))
    assert prepares[name] == 1  # the first call prepared; the later ones ran the prepared kernel
    unprepared(monkeypatch, name)
    plain = define()
    for seed in range(3, 6):
        assert_identical(prepared.execute(inputs(seed)), plain.execute(inputs(seed)))
    assert prepares[name] == 1 and prepared.last_runtime().describe()[0].runs_as == "op kernel"


def test_grouped_gemm_prefill_config_prepared(prepares, monkeypatch):
    """The GEMM's prefill form (both operands dequantized to fp16 first, then an fp16 grouped GEMM): more than 64
    tokens per expert."""
    def inputs(seed):
        return gemm_inputs(130, 128, 64, [65, 0, 65], DEVICE, seed=seed).as_list()

    prepared = gemm_fusion()
    first = prepared.execute(inputs(0))
    unprepared(monkeypatch, GEMM)
    plain = gemm_fusion()
    assert_identical(first, plain.execute(inputs(0)))
    assert_identical(prepared.execute(inputs(1)), plain.execute(inputs(1)))
    assert prepares[GEMM] == 1


def test_a_new_signature_prepares_again(prepares):
    """Each signature has a plan of its own, prepared by its first call; calls alternating between them stay
    right (nothing prepared for one leaks into the other)."""
    name, define, inputs = layout_case()
    fd = define()
    a, b = inputs(0), inputs(1, m=300, tokens=(100, 60, 140))
    for i, args in enumerate([a, b, a, b]):
        got = fd.execute(args)[0]
        x, starts, sf = args
        want = ref.preprocess_grouped_matmul_input_sf(x, starts, sf)
        assert torch.equal(_storage_bytes(got), _storage_bytes(want))
        assert prepares[name] == min(i + 1, 2)


@pytest.mark.parametrize("case, bad, match", [
    ("grouped GEMM", lambda args: args[:3] + [args[3][:, :, :2].contiguous()] + args[4:],
     r"fd.ops.cutlass_nvfp4_grouped_mm: nvfp4_grouped_mm: scale2 must be a contiguous \[G, roundup\(N,128\), K/16\] = "
     r"\(2, 128, 4\) e4m3 tensor .*got shape \(2, 128, 2\)"),
    ("layout op", lambda args: [args[0], args[1], args[2][:2]],
     "fd.ops.preprocess_grouped_matmul_input_sf: input_offsets has 3 entries but output_offsets has 2"),
    ("grouped quantize", lambda args: [args[0][:, :40].contiguous(), args[1], args[2]],
     "fd.ops.nv_grouped_block_quantize: the last dim of input is 40, not a multiple of block_size 16"),
    ("block quantize", lambda args: [args[0][:, :24].contiguous(), args[1]],
     "fd.ops.nv_block_quantize: the last dim of input is 24, not a multiple of block_size 16"),
])
def test_bad_metadata_on_a_new_signature_raises_every_time(case, bad, match, prepares):
    """After a good signature is prepared, inputs of a new, bad signature get pyfuser's error naming the input
    and what was expected against what was found, on every call (a failed preparation is not kept), and the good
    signature keeps working."""
    name, define, inputs = CASES[case]()
    fd = define()
    good = inputs(0)
    want = fd.execute(good)
    for _ in range(2):
        with pytest.raises(FusionExecutionError, match=match):
            fd.execute(bad(inputs(1)))
    assert_identical(fd.execute(good), want)
    assert prepares[name] == 3  # the good signature once, the bad one on each of its calls


def test_cached_calls_skip_the_metadata_checks(monkeypatch):
    """The prepared kernel's calls do not redo the operand contract or the offsets' dtype checks; a new signature
    does (here: the checks replaced by failing ones after the first signature was prepared)."""
    name, define, inputs = gemm_case()
    fd = define()
    want = fd.execute(inputs(0))

    def fail(*args, **kwargs):
        raise FusionExecutionError("checked again")

    monkeypatch.setattr(narrow_precision, "gemm_contract", fail)
    monkeypatch.setattr(narrow_precision, "offsets_check", fail)
    assert_identical(fd.execute(inputs(0)), want)
    with pytest.raises(FusionExecutionError, match="checked again"):
        fd.execute(inputs(1, tokens=(20, 20)))
    _, define_layout, layout_inputs = layout_case()
    with pytest.raises(FusionExecutionError, match="checked again"):
        define_layout().execute(layout_inputs(0))


@pytest.mark.parametrize("mode", ["sync", "device"])
def test_scale1_storage_is_checked_per_call(prepares, mode, device_checks):
    """scale1's storage size is not part of a signature: a call whose scale1 (same sizes and strides) has a smaller
    storage than the prepared one's is checked anew and refused. Whether the padded groups fit depends on the
    offsets' values, so that check reads them at once with sync_offset_checks, and otherwise runs on the device
    and reports from a later call (on CPU too here: device_checks)."""
    name, define, inputs = gemm_case()
    fd = define()
    opts = ["sync_offset_checks"] if mode == "sync" else []
    good = inputs(0)
    want = fd.execute(good, _enable_options=opts)
    short = list(good)
    short[2] = good[2].clone()  # a compact [M, K/16] copy: too few rows for the padded groups
    assert short[2].stride() == good[2].stride()
    if mode == "sync":
        with pytest.raises(FusionExecutionError, match="scale1 holds 32 block-scale rows"):
            fd.execute(short, _enable_options=opts)
    else:
        fd.execute(short)  # flagged on the device (its reads of scale1 stay inside the storage)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()  # the flag is read by the next call, once the GPU has written it
        with pytest.raises(FusionExecutionError,
                           match=r"scale1 holds 32 block-scale rows.*found on the device by an earlier call"):
            fd.execute(good)
    assert_identical(fd.execute(good, _enable_options=opts), want)
    assert prepares[name] == 1


def test_negative_bit_inputs_through_the_prepared_kernel():
    """A negative-bit input is resolved before the prepared kernel sees it, on its preparing call and after."""
    x = torch.randn(32, 64, device=DEVICE) * 3
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.Float)
        q, s = fd.ops.nv_block_quantize(t)
        fd.add_output(q)
        fd.add_output(s)
    data, scales = ref.quantize_nvfp4_fused(x, None)
    for _ in range(2):
        outs = fd.execute([torch._neg_view(-x)])
        assert torch.equal(outs[0].view(torch.uint8), data.view(torch.uint8))
        assert torch.equal(outs[1].view(torch.uint8), scales.view(torch.uint8))


# --------------------------------------------------------------------------------------------------------------
# the device-side offset checks (the CUDA default), on CPU tensors


@pytest.fixture
def device_checks(monkeypatch):
    """Runtimes built from now on check offsets on the device and report from a later call, on CPU too."""
    monkeypatch.setattr(fusion_runtime, "DEFERRED_ERROR_DEVICES", fusion_runtime.DEFERRED_ERROR_DEVICES | {"cpu"})


@pytest.mark.parametrize("case, spoil, match, sync_match", [
    ("grouped GEMM", lambda args: args[:6] + [_i32([20, 0])] + args[7:],
     r"fd.ops.cutlass_nvfp4_grouped_mm: expert_offsets must be non-decreasing start rows in \[0, 32\]",
     r"expert_offsets must be non-decreasing start rows in \[0, 32\], got \[20, 0\]"),
    ("layout op", lambda args: [args[0], args[1], _i32([0, 100, 128])],
     r"fd.ops.preprocess_grouped_matmul_input_sf: output_offsets must place each group's rows, padded to a "
     r"multiple of 128, in order without overlap",
     r"output_offsets \[0, 100, 128\] overlap: group 1 starts at row 100"),
    ("grouped quantize", lambda args: [args[0], _i32([0, 30, 24]), args[2]],
     r"fd.ops.nv_grouped_block_quantize: input_offsets must be non-decreasing start rows in \[0, 24\] starting "
     r"at 0", r"input_offsets must be non-decreasing start rows in \[0, 24\], got \[0, 30, 24\]"),
])
def test_device_offset_checks_report_from_a_later_call(case, spoil, match, sync_match, device_checks,
                                                       monkeypatch):
    """The check of a prepared kernel's call runs on the device (the Triton check kernel, interpreted here) and
    never reads the values on the host; the next call raises, naming the op and the input, and says that the
    offending call's outputs are invalid; the flags are then clear."""
    name, define, inputs = CASES[case]()
    fd = define()
    good = inputs(0)
    want = fd.execute(good)
    bad = spoil(good)
    real_tolist = torch.Tensor.tolist

    def no_reads_of(t, _bad=[x for x in bad if x.dtype == torch.int32]):
        if any(t is b for b in _bad):
            raise AssertionError("offset values were read on the host")
        return real_tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", no_reads_of)
    fd.execute(bad)  # flagged on the device, reported later
    monkeypatch.undo()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()  # the flag is read by the next call, once the GPU has written it
    with pytest.raises(FusionExecutionError, match=match + r".*found on the device by an earlier call"):
        fd.execute(good)
    assert_identical(fd.execute(good), want)  # reported once: the flags are clear
    with pytest.raises(FusionExecutionError, match=sync_match):  # at once, with the values (a plan of its own)
        fd.execute(bad, _enable_options=["sync_offset_checks"])


def _no_check_launch(monkeypatch):
    """From now on, preparing the offsets' own check launch fails the test."""
    from pyfuser.ops import offset_checks

    def no_check_launch(*args):
        raise AssertionError("the offsets' check kernel was prepared: the op's launch should run the check itself")

    monkeypatch.setattr(offset_checks, "_prepare_device_flags", no_check_launch)


def test_gemm_runs_its_device_check_in_its_own_launch(device_checks, monkeypatch):
    """At decode shapes the GEMM's program 0 checks the offsets (group_offsets_bits): no check kernel is launched,
    and bad offsets are still reported by the next call; a call with checks off or on the host launches none."""
    _no_check_launch(monkeypatch)
    name, define, inputs = CASES["grouped GEMM"]()
    fd = define()
    good = inputs(0)
    want = fd.execute(good)
    fd.execute(good[:6] + [_i32([20, 0])] + good[7:])  # flagged by the GEMM's launch
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(FusionExecutionError, match=r"expert_offsets must be non-decreasing.*found on the device"):
        fd.execute(good)
    assert_identical(fd.execute(good), want)
    assert_identical(fd.execute(good, _disable_options=["offset_checks"]), want)


@pytest.mark.parametrize("form", ["call", "inline", "launch"])
def test_gemm_check_form_reports_bad_offsets(form, device_checks, monkeypatch):
    """Each ``check_form`` of a decode config reports bad offsets from the next call and gives the same result:
    "call" and "inline" run the check in the GEMM's own launch (no check launch is prepared), "launch" prepares
    the check's own launch once and runs the unchecked GEMM after it."""
    from dataclasses import replace

    from pyfuser.kernels import nvfp4_grouped_gemm as gg
    from pyfuser.ops import offset_checks

    default = gg.default_config
    monkeypatch.setattr(gg, "default_config", lambda *a: replace(default(*a), check_form=form))
    prepared = []
    real_prepare = offset_checks._prepare_device_flags
    monkeypatch.setattr(offset_checks, "_prepare_device_flags", lambda *a: prepared.append(a) or real_prepare(*a))
    name, define, inputs = CASES["grouped GEMM"]()
    fd = define()
    good = inputs(0)
    want = fd.execute(good)
    assert_identical(want, fd.execute(good, _disable_options=["offset_checks"]))
    assert len(prepared) == (form == "launch")  # the check's own launch, prepared once, only in that form
    fd.execute(good[:6] + [_i32([20, 0])] + good[7:])
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(FusionExecutionError, match=r"expert_offsets must be non-decreasing.*found on the device"):
        fd.execute(good)
    assert_identical(fd.execute(good), want)
    assert len(prepared) == (form == "launch")


# Bad offsets of the layout op ([40, 6] input, tokens (7, 0, 33): starts [0, 7, 7], outs [0, 128, 128], a buffer
# of 40 + 127*3 = 421 rows) and of the grouped quantize ([24, 48] input, tokens (5, 19, 0): starts [0, 5, 24],
# outs [0, 128, 256], 405 rows), each with the message of the bit it sets (device) and the host check's (sync).
_STARTS_BAD = r"input_offsets must be non-decreasing start rows in \[0, {m}\] starting at 0"
_OUTS_BAD = (r"output_offsets must place each group's rows, padded to a multiple of 128, in order without overlap "
             r"inside the block-scales \(the buffer's m \+ 127\*g = {cap} rows\)")
_FUSED_BAD = [
    ("layout op", "decreasing starts", [0, 30, 7], None, _STARTS_BAD.format(m=40),
     r"input_offsets must be non-decreasing start rows in \[0, 40\], got \[0, 30, 7\]"),
    ("layout op", "first start not 0", [1, 7, 7], None, _STARTS_BAD.format(m=40),
     r"input_offsets must start at 0 .*got \[1, 7, 7\]"),
    ("layout op", "outs overlapping", None, [0, 100, 256], _OUTS_BAD.format(cap=421),
     r"output_offsets \[0, 100, 256\] overlap: group 1 starts at row 100"),
    ("layout op", "capacity exceeded", None, [0, 128, 300], _OUTS_BAD.format(cap=421),
     r"output_offsets \[0, 128, 300\] need 428 block-scale rows, but the buffer's m \+ 127\*g = 421 rows"),
    ("grouped quantize", "decreasing starts", [0, 30, 24], None, _STARTS_BAD.format(m=24),
     r"input_offsets must be non-decreasing start rows in \[0, 24\], got \[0, 30, 24\]"),
    ("grouped quantize", "outs overlapping", None, [0, 100, 256], _OUTS_BAD.format(cap=405),
     r"output_offsets \[0, 100, 256\] overlap: group 1 starts at row 100"),
    ("grouped quantize", "capacity exceeded", None, [0, 300, 428], _OUTS_BAD.format(cap=405),
     r"output_offsets \[0, 300, 428\] need 428 block-scale rows, but the buffer's m \+ 127\*g = 405 rows"),
]


@pytest.mark.parametrize("case, what, starts, outs, match, sync_match", _FUSED_BAD,
                         ids=[f"{c}: {w}" for c, w, *_ in _FUSED_BAD])
def test_layout_and_grouped_quantize_run_their_device_check_in_their_own_launch(case, what, starts, outs, match,
                                                                               sync_match, device_checks,
                                                                               monkeypatch):
    """The layout op's program (0, 0) and the grouped quantize's program 0 check the offsets (group_offsets_bits):
    no check kernel is prepared or launched, bad offsets are reported by the next call with the message the
    check's own launch gave, the flags are then clear, and the results are those of the unprepared kernel (which
    launches the check separately), bit for bit."""
    name, define, inputs = CASES[case]()
    good = inputs(0)
    bad = [good[0], good[1] if starts is None else _i32(starts), good[2] if outs is None else _i32(outs)]
    plain_want = define().execute(good)  # (prepared too: computed before the check launch is forbidden)
    _no_check_launch(monkeypatch)
    fd = define()
    want = fd.execute(good)
    assert_identical(want, plain_want)
    fd.execute(bad)  # flagged by the op's own launch
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(FusionExecutionError, match=f"fd.ops.{name}: {match} \\(found on the device by an earlier"):
        fd.execute(good)
    assert_identical(fd.execute(good), want)  # reported once: the flags are clear
    # Checks off: nothing checks (no error now, none reported later); the results of good offsets unchanged.
    fd.execute(bad, _disable_options=["offset_checks"])
    assert_identical(fd.execute(good, _disable_options=["offset_checks"]), want)
    assert_identical(fd.execute(good), want)
    # On the host (sync_offset_checks) a problem still raises at once, with the values.
    with pytest.raises(FusionExecutionError, match=f"fd.ops.{name}: {sync_match}"):
        fd.execute(bad, _enable_options=["sync_offset_checks"])
    assert_identical(fd.execute(good), want)


def test_device_flag_is_one_view_per_flags_and_slot():
    """PreparedGroupCheck.device_flag (what the three ops that run the check in their own launch ask for): in
    device mode the one-element view of the call's slot, made once per flags and slot; None with checks off, and
    None after a host check, which raises at once on bad offsets."""
    from pyfuser.ops import offset_checks, run_context
    from pyfuser.runtime.device_errors import DeviceErrorSink

    starts, outs = _offsets_inputs((7, 0, 33))
    check = narrow_precision.offsets_check(LAYOUT, 40, starts, outs)
    prepared = offset_checks.PreparedGroupCheck(check)
    sink, views = DeviceErrorSink(), []
    for call in range(2):
        token = run_context.enter(run_context.RunContext(starts.device, errors=sink))
        try:
            views.append([prepared.device_flag(starts, outs) for _ in range(2)])  # slots 0 and 1 of this call
        finally:
            run_context.leave(token)
    flags = sink.host_flags(starts.device, 0, check)
    for slot, (first, second) in enumerate(zip(*views)):
        assert first is second  # (the same view, call after call)
        assert first.shape == (1,) and first.dtype == torch.int32 and first.data_ptr() == flags[slot:].data_ptr()
    for mode, bad, expect in ((run_context.OFFSET_CHECKS_OFF, True, None),
                              (run_context.OFFSET_CHECKS_SYNC, False, None),
                              (run_context.OFFSET_CHECKS_SYNC, True, FusionExecutionError)):
        token = run_context.enter(run_context.RunContext(starts.device, mode, errors=sink))
        try:
            args = (starts, _i32([0, 100, 256])) if bad else (starts, outs)
            if expect is None:
                assert prepared.device_flag(*args) is None
            else:
                with pytest.raises(expect, match="output_offsets \\[0, 100, 256\\] overlap"):
                    prepared.device_flag(*args)
        finally:
            run_context.leave(token)


def test_the_error_sink_tells_a_set_flag_without_raising():
    """DeviceErrorSink.flagged: False before any check ran and while every flag is clear, True once one is set
    (what poll raises, and poll clears it); a run asks whether a caller's CUDA graph is capturing only then."""
    from pyfuser.runtime.device_errors import DeviceErrorSink

    starts, outs = _offsets_inputs((7, 0, 33))
    check = narrow_precision.offsets_check(LAYOUT, 40, starts, outs)
    sink = DeviceErrorSink()
    assert not sink.flagged()
    flags = sink.host_flags(starts.device, 3, check)
    assert not sink.flagged()
    flags[3] = 2  # (the outputs-overlap bit, as a kernel ORs it)
    assert sink.flagged()
    with pytest.raises(FusionExecutionError, match="found on the device by an earlier call"):
        sink.poll()
    assert not sink.flagged() and not flags.any()


def test_a_run_without_set_flags_asks_no_capture_status(device_checks, monkeypatch):
    """A CUDA run polls the fusion's flags before its steps; the capture-status query (a CUDA call) is made only
    when a flag is set, so a good call makes none."""
    name, define, inputs = CASES["layout op"]()
    fd = define()
    fd.execute(inputs(0))
    runtime = fd._executor.last_runtime
    queries = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: queries.append(1) or False)
    monkeypatch.setattr(runtime, "_cuda", True)  # (as on CUDA: the query is only made there)
    for seed in range(3):
        fd.execute(inputs(seed))
    assert runtime.errors.flagged() is False and not queries


@pytest.mark.parametrize("case", ["layout op", "grouped quantize"])
def test_fused_device_check_results_equal_the_unprepared_kernel(case, device_checks, monkeypatch):
    """Call after call with new values, the launch that also runs the check gives exactly what the unprepared
    kernel (plain launch, check launched on its own) gives."""
    name, define, inputs = CASES[case]()
    prepared = define()
    want = [prepared.execute(inputs(seed)) for seed in range(3)]
    unprepared(monkeypatch, name)
    plain = define()
    for seed, w in enumerate(want):
        assert_identical(w, plain.execute(inputs(seed)))


@pytest.mark.parametrize("case", ["layout op", "grouped quantize"])
def test_host_checks_raise_at_once_without_a_check_launch(case, monkeypatch):
    """Where the run collects no device flags (a CPU runtime) the values are read at once, and a problem raises in
    the offending call; the op's launch then runs without the check (no flag to OR into)."""
    if DEVICE.type == "cuda":
        pytest.skip("CUDA runtimes check on the device")
    name, define, inputs = CASES[case]()
    fd = define()
    good = inputs(0)
    want = fd.execute(good)
    _no_check_launch(monkeypatch)
    with pytest.raises(FusionExecutionError, match=f"fd.ops.{name}: output_offsets .* overlap"):
        fd.execute([good[0], good[1], _i32([0, 100, 256])])
    assert_identical(fd.execute(good), want)


@pytest.mark.parametrize("case", ["layout op", "grouped quantize"])
def test_no_launch_still_checks_the_offsets(case, device_checks):
    """An input with no columns has nothing to launch (the op's results are empty): the check then takes its own
    launch, and bad offsets are still reported by the next call."""
    name, define, inputs = CASES[case]()
    fd = define()
    good = inputs(0)
    good[0] = good[0][:, :0]
    want = fd.execute(good)
    fd.execute([good[0], _i32([0, 30, 7]), good[2]])
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    with pytest.raises(FusionExecutionError, match=r"input_offsets must be non-decreasing.*found on the device"):
        fd.execute(good)
    assert_identical(fd.execute(good), want)


# --------------------------------------------------------------------------------------------------------------
# the MoE layer: every prepared kernel at once (load prologues, the counting sort's launch, GEMMs)


def test_moe_layer_prepared_equals_unprepared(monkeypatch):
    """The NVFP4 MoE layer (two grouped quantizes computing their input through load prologues, two GEMMs, the
    counting sort with its epilogue) gives the same bits call after call with new tokens as with every op kernel
    unprepared."""
    from pyfuser.demo import moe_nvfp4 as moe

    cfg = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)
    weights = moe.quantize_weights(moe.make_weights(cfg, DEVICE))
    prepared = moe.MoENVFP4(cfg, weights)
    xs = [torch.randn(6, cfg.hidden, generator=torch.Generator().manual_seed(s)).to(DEVICE, torch.bfloat16)
          for s in range(3)]
    outs = [prepared(x) for x in xs]
    for name in (LAYOUT, QUANT, GROUPED, GEMM):
        unprepared(monkeypatch, name)
    plain = moe.MoENVFP4(cfg, weights)
    for x, out in zip(xs, outs):
        assert_identical([out], [plain(x)])


def test_moe_layer_runs_its_offsets_checks_in_its_ops_launches(device_checks, monkeypatch):
    """With device checks, each of the MoE layer's four offsets checks (two grouped quantizes through load
    prologues, two decode GEMMs) runs inside its op's launch: no check kernel is prepared, every call asks for the
    four flags, and the results are those of the unprepared ops (which launch the checks separately)."""
    from pyfuser.demo import moe_nvfp4 as moe
    from pyfuser.ops import offset_checks

    cfg = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)
    weights = moe.quantize_weights(moe.make_weights(cfg, DEVICE))
    xs = [torch.randn(6, cfg.hidden, generator=torch.Generator().manual_seed(s)).to(DEVICE, torch.bfloat16)
          for s in range(2)]
    separate = offset_checks._prepare_device_flags
    flags_asked = collections.Counter()
    device_flag = offset_checks.PreparedGroupCheck.device_flag

    def counting(self, *args):
        flags_asked[self.check.op] += 1
        return device_flag(self, *args)

    monkeypatch.setattr(offset_checks.PreparedGroupCheck, "device_flag", counting)
    _no_check_launch(monkeypatch)
    prepared = moe.MoENVFP4(cfg, weights)
    outs = [prepared(x) for x in xs]
    assert flags_asked == {GROUPED: 2 * len(xs), GEMM: 2 * len(xs)}
    monkeypatch.setattr(offset_checks, "_prepare_device_flags", separate)
    for name in (LAYOUT, QUANT, GROUPED, GEMM):
        unprepared(monkeypatch, name)
    plain = moe.MoENVFP4(cfg, weights)
    for x, out in zip(xs, outs):
        assert_identical([out], [plain(x)])


def test_counting_sort_step_prepared_call_after_call():
    """The counting sort's launch (with the offsets kernel as its epilogue) is bound by a segment's first call; later
    calls with other routings give eager's permutation, inverse, counts and offsets."""
    from test_counting_sort import _eager_routing, _moe_routing, _routing_logits

    t, e, k = 16, 8, 2
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, e], contiguity=True, dtype=DataType.Float)
        for out in _moe_routing(fd, x, t, e, k):
            fd.add_output(out)
    for seed in range(3):
        logits = _routing_logits(t, e, seed=seed)
        for got, want in zip(fd.execute([logits]), _eager_routing(logits, k, e)):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert [s.kind.value for s in fd.segments()].count("CountingSort") == 1
    assert any(r.name.startswith("counting_sort + epilogue") for seg in fd.last_execution() for r in seg.steps)
