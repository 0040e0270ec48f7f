"""The cached call's fast path (docs/runtime.md, "Host time"): what it skips must never change what it computes.

A call without explicit options takes the options of a cached environment, encodes its signature in one pass
over the inputs as given, and runs the plan's compiled function (a generated kernel without per-call decisions as
straight-line code). Each shortcut is tested against the change it must notice: a changed stride, dtype, shape,
alignment, negative bit, device, option or environment variable takes another runtime (or pyfuser's error), never
the cached one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.errors import InputTypeError, InputValidationError, OptionError
from pyfuser.runtime import executor_cache, options as options_mod
from pyfuser.runtime.executor_cache import FusionExecutorCache
from pyfuser.runtime.signature import flat_signature, input_signature
from pyfuser.runtime.options import Options
from pyfuser.runtime.steps import KernelStep

from harness import DEVICE, make


def _relu_add(fd):
    a = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
    b = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=DataType.Float)  # any strides
    fd.add_output(fd.ops.relu(fd.ops.add(a, b)))


def _build(fn):
    with FusionDefinition() as fd:
        fn(fd)
    return fd


def _runtimes(fd) -> int:
    return fd._executor.num_runtimes()


def test_the_one_pass_signature_equals_the_general_one():
    x = make([4, 6])
    inputs = [x, x.t(), x[:, 1:], torch._neg_view(x), make([3], dtype=torch.complex64).conj(), 3, True, False,
              np.int64(7), 2.5, 1 + 2j, None, "text", make([2], dtype=torch.float16)]
    fast = flat_signature(inputs)
    assert fast == input_signature(inputs)
    # an int and a bool of equal value, an int and a numpy int: distinct
    assert flat_signature([1]) != flat_signature([True])
    assert flat_signature([1]) != flat_signature([np.int64(1)])
    assert flat_signature([1]) != flat_signature([2])
    # a nested list (a define_vector's values) is left to flatten_inputs
    assert flat_signature([x, [2, 3]]) is None


def test_every_tensor_property_of_the_signature_is_encoded():
    base = make([8, 16])
    variants = {
        "stride": make([16, 8]).t(),
        "dtype": make([8, 16], dtype=torch.float64),
        "shape": make([8, 15]),
        "alignment": make([8 * 16 + 1])[1:].view(8, 16),
        "negative bit": torch._neg_view(make([8, 16])),
        "device": make([8, 16], device="meta"),
    }
    key = input_signature([base])
    for what, x in variants.items():
        assert input_signature([x]) != key, what
        assert flat_signature([x]) != key, what


@pytest.mark.parametrize("change", ["stride", "shape", "alignment", "negative bit"])
def test_a_changed_input_takes_another_runtime(change):
    fd = _build(_relu_add)
    a, b = make([8, 16]), make([8, 16])
    torch.testing.assert_close(fd.execute([a, b])[0], torch.relu(a + b))
    fd.execute([a, b])
    assert _runtimes(fd) == 1
    if change == "stride":
        b2 = make([8, 32])[:, ::2]
    elif change == "shape":
        a, b2 = make([8, 15]), make([8, 15])
    elif change == "alignment":
        b2 = make([8 * 16 + 1])[1:].view(8, 16)
    else:
        b2 = torch._neg_view(make([8, 16]))
    out = fd.execute([a, b2])[0]
    assert _runtimes(fd) == 2
    torch.testing.assert_close(out, torch.relu(a + b2))
    torch.testing.assert_close(fd.execute([a, b2])[0], torch.relu(a + b2))  # and that runtime is cached
    assert _runtimes(fd) == 2


def test_wrong_inputs_after_cached_calls_get_our_errors():
    fd = _build(_relu_add)
    a, b = make([4, 5]), make([4, 5])
    for _ in range(3):
        fd.execute([a, b])
    with pytest.raises(InputTypeError, match=r"input 0 \(T0\) must have dtype torch.float32"):
        fd.execute([a.double(), b])
    with pytest.raises(InputValidationError, match="contradict the declared contiguity"):
        fd.execute([make([5, 4]).t(), b])
    with pytest.raises(InputValidationError, match="must have rank 2"):
        fd.execute([make([20]), b])
    with pytest.raises(InputTypeError):
        fd.execute([a, 1.0])
    with pytest.raises(InputValidationError, match="expected 2 inputs"):
        fd.execute([a])
    assert _runtimes(fd) == 1
    torch.testing.assert_close(fd.execute([a, b])[0], torch.relu(a + b))


def test_tuple_and_nested_inputs_take_the_general_path():
    fd = _build(_relu_add)
    a, b = make([3, 4]), make([3, 4])
    torch.testing.assert_close(fd.execute((a, b))[0], torch.relu(a + b))
    torch.testing.assert_close(fd.execute([a, b])[0], torch.relu(a + b))
    assert _runtimes(fd) == 1  # a tuple and a list of the same inputs: one signature
    with FusionDefinition() as fd2:  # define_vector(2): its values come as one nested list
        t = fd2.define_tensor([-1], contiguity=[True])
        fd2.add_output(fd2.ops.reshape(t, fd2.define_vector(2)))
    x = make([6])
    assert fd2.execute([x, [2, 3]])[0].shape == (2, 3)
    assert fd2.execute([x, [3, 2]])[0].shape == (3, 2)  # the values are part of the signature
    assert fd2.execute([x, [2, 3]])[0].shape == (2, 3)
    assert _runtimes(fd2) == 2


def test_options_are_keyed_by_every_field():
    names = [f for f in Options.__dataclass_fields__ if f != "bits"]
    seen = {Options().bits}
    for name in names:
        default = getattr(Options(), name)
        seen.add(Options(**{name: not default}).bits)
    assert len(seen) == len(names) + 1


def test_an_explicit_option_and_a_changed_environment_take_other_runtimes(monkeypatch):
    fd = _build(_relu_add)
    a, b = make([4, 4]), make([4, 4])
    fd.execute([a, b])
    assert fd.last_execution()[0].runs_as == "triton" or DEVICE.type == "cpu"
    fd.execute([a, b], _disable_options=["kernel_codegen"])
    assert _runtimes(fd) == 2
    assert fd.last_execution()[0].runs_as == "aten"
    fd.execute([a, b])  # back to the defaults: the first runtime
    assert _runtimes(fd) == 2
    monkeypatch.setenv("PYFUSER_DISABLE", "kernel_codegen")
    torch.testing.assert_close(fd.execute([a, b])[0], torch.relu(a + b))
    assert fd.last_execution()[0].runs_as == "aten"  # the environment is read on every call
    assert _runtimes(fd) == 2  # the same options as the explicit call: its runtime
    monkeypatch.setenv("PYFUSER_DISABLE", "infer_contiguity")
    fd.execute([a, b])
    assert _runtimes(fd) == 3
    monkeypatch.setenv("PYFUSER_DISABLE", "no_such_option")
    with pytest.raises(OptionError, match="no_such_option"):
        fd.execute([a, b])
    with pytest.raises(OptionError, match="no_such_option"):  # an unknown name is refused on every call
        fd.execute([a, b])
    monkeypatch.delenv("PYFUSER_DISABLE")
    fd.execute([a, b])
    assert _runtimes(fd) == 3
    assert options_mod.default_options() == Options()


def test_least_recently_used_signature_is_evicted(monkeypatch):
    monkeypatch.setattr(FusionExecutorCache, "MAX_SIGNATURES", 2)
    fd = _build(_relu_add)
    shapes = {n: (make([2, n]), make([2, n])) for n in (3, 4, 5)}
    fd.execute(list(shapes[3]))
    fd.execute(list(shapes[4]))
    fd.execute(list(shapes[3]))  # 3 is now the most recently used
    fd.execute(list(shapes[3]))  # (a repeated hit of the last runtime)
    fd.execute(list(shapes[5]))  # evicts 4
    cache = fd._executor
    assert cache.has_runtime(list(shapes[3])) and cache.has_runtime(list(shapes[5]))
    assert not cache.has_runtime(list(shapes[4]))
    fd.execute(list(shapes[5]))
    fd.execute(list(shapes[4]))  # evicts 3, the least recently used
    assert not cache.has_runtime(list(shapes[3]))
    assert cache.stats["misses"] == 4


def _kernel_steps(fd):
    return [s for s in fd._executor.last_runtime.plan.steps if isinstance(s, KernelStep)]


def test_straight_line_kernel_steps_equal_the_general_path():
    def fusion(fd):
        a = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s = fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.mul(a, s))  # a by-value scalar
        fd.add_output(fd.ops.sum(a, dims=[1]))  # a second output of another shape (or kernel)

    fd = _build(fusion)
    a = make([6, 7])
    for s in (2.0, -3.5):
        out = fd.execute([a, s])
        torch.testing.assert_close(out[0], a * s)
        torch.testing.assert_close(out[1], a.sum(1))
    steps = _kernel_steps(fd)
    if not steps:
        pytest.skip("no generated kernels on this device")
    rt = fd._executor.last_runtime
    for step in steps:
        assert step.direct is not None and step.last_path == "kernel"
    general = rt.plan.bind([a, 5.0])
    for step in rt.plan.steps:
        step.run(general)
    straight = rt.plan.bind([a, 5.0])
    for step in rt.plan.steps:
        (getattr(step, "direct", None) or step.run)(straight)
    for x, y in zip(general, straight):
        if isinstance(x, torch.Tensor):
            assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
            torch.testing.assert_close(x, y)


def test_a_guarded_kernel_step_keeps_its_guard():
    def fusion(fd):  # an ATen segment feeding a kernel: its layout is guarded with layout inference off
        a = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
        m = fd.ops.matmul(a, a)
        fd.add_output(fd.ops.relu(fd.ops.permute(m, [1, 0])))

    fd = _build(fusion)
    a = make([4, 4])
    out = fd.execute([a], _disable_options=["infer_contiguity"])[0]
    torch.testing.assert_close(out, torch.relu((a @ a).t()))
    steps = _kernel_steps(fd)
    if not steps:
        pytest.skip("no generated kernels on this device")
    assert all(step.guards and step.direct is None for step in steps)
    assert fd._executor.last_runtime.kernel_step(1).last_path == "kernel"


def test_a_bare_runtime_runs_the_compiled_plan_and_an_alias_still_writes():
    fd = _build(_relu_add)
    a, b = make([3, 3]), make([3, 3])
    fd.execute([a, b])
    rt = fd._executor.last_runtime
    if rt._bare:
        assert rt.run is rt.plan.run
    with FusionDefinition() as fd2:
        x = fd2.define_tensor([-1], contiguity=[True], dtype=DataType.Float)
        y = fd2.ops.add(x, 1.0)
        fd2.add_output(y, alias_input=x)
        fd2.add_output(fd2.ops.mul(y, 2.0))
    x = make([5])
    expected = x + 1.0
    for _ in range(2):
        out = fd2.execute([x])
        torch.testing.assert_close(x, expected)
        torch.testing.assert_close(out[0], expected * 2.0)
        expected = expected + 1.0


class _RecordingCompiled:
    """A compiled kernel's stand-in: records what its launcher was called with."""

    function = "function"
    packed_metadata = "metadata"

    def __init__(self, calls: list):
        self.calls = calls

    def run(self, *args):
        self.calls.append(args)


def test_a_bound_launch_keys_its_specializations_by_alignment_and_integer_scalars(monkeypatch):
    from pyfuser.codegen import launcher as launcher_mod

    compiles, runs = [], []

    def compile_once(self, tensors, scalars, jit_tensors):
        compiles.append(([t.data_ptr() % 16 == 0 for t in tensors], tuple(scalars)))
        return launcher_mod.compiled_runner(_RecordingCompiled(runs))

    monkeypatch.setattr(launcher_mod.BoundLaunch, "_launch", compile_once)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)
    monkeypatch.setattr(launcher_mod, "_launch_hooks_installed", lambda: False)
    bound = launcher_mod.Launcher(None, 4).bind((3,), (7, 128), torch.device("cuda", 0))
    base = torch.empty(64, dtype=torch.float32)
    aligned = [base[:16], base[16:32]]
    misaligned = [base[:16], base[17:33]]
    assert all(t.data_ptr() % 16 == 0 for t in aligned) and misaligned[1].data_ptr() % 16 == 4

    def ptrs(ts):
        return tuple(t.data_ptr() for t in ts)

    bound(aligned)
    bound(aligned)
    assert len(compiles) == 1 and runs[-1] == (3, 1, 1, 1000, "function", "metadata", None, None, None,
                                               *ptrs(aligned), 7, 128)
    bound(misaligned)  # a pointer off 16 bytes: another specialization
    bound(misaligned)
    assert len(compiles) == 2 and compiles[1][0] == [True, False]
    assert runs[-1][9:] == (*ptrs(misaligned), 7, 128)
    bound(aligned, (16,))  # integer scalars: 1, multiples of 16 and others specialize apart
    bound(aligned, (32,))
    bound(aligned, (1,))
    bound(aligned, (17,))
    bound(aligned, (33,))
    assert len(compiles) == 5
    assert runs[-1][9:] == (*ptrs(aligned), 33, 7, 128)
    bound(aligned)
    assert len(compiles) == 5 and len(runs) == 5  # (a first launch of a specialization goes through the JIT)


class CudaLauncher:
    """Stands for Triton 3.6's compiled launcher: a C ``launch`` behind a Python ``__call__`` that adds scratch."""

    def __init__(self, calls, global_scratch_size=0, profile_scratch_size=0):
        self.calls = calls
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, profile_scratch_size
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def launch(self, *args):
        self.calls.append(("launch", *args))

    def __call__(self, *args):
        self.calls.append(("__call__", *args))


class _CompiledWith:
    function, packed_metadata = "function", "metadata"

    def __init__(self, run):
        self.run = run


def test_a_compiled_launcher_without_scratch_is_called_at_its_c_launch(monkeypatch):
    """compiled_runner: the C launch with the arguments CudaLauncher.__call__ would pass it (no scratch: None
    pointers, the kernel's launch flags); a kernel with scratch, or another launcher, is called as it is."""
    from pyfuser.codegen import launcher as launcher_mod

    calls = []
    run, head = launcher_mod.compiled_runner(_CompiledWith(CudaLauncher(calls)))
    run(3, 1, 1, 77, *head, 10, 20)
    assert calls[-1] == ("launch", 3, 1, 1, 77, "function", False, True, None, None, "metadata", None, None, None,
                         10, 20)
    for scratch in (dict(global_scratch_size=256), dict(profile_scratch_size=64)):
        run, head = launcher_mod.compiled_runner(_CompiledWith(CudaLauncher(calls, **scratch)))
        run(3, 1, 1, 77, *head, 10)
        assert calls[-1] == ("__call__", 3, 1, 1, 77, "function", "metadata", None, None, None, 10)
    # Through a bound launch: the first call compiles (the JIT), later ones reach the C launch.
    monkeypatch.setattr(launcher_mod.BoundLaunch, "_launch",
                        lambda self, t, s, j: launcher_mod.compiled_runner(_CompiledWith(CudaLauncher(calls))))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 5, raising=False)
    monkeypatch.setattr(launcher_mod, "_launch_hooks_installed", lambda: False)
    bound = launcher_mod.Launcher(None, 4).bind((2,), (9,), torch.device("cuda", 0))
    t = torch.empty(16)
    bound([t])
    bound([t])
    assert calls[-1] == ("launch", 2, 1, 1, 5, "function", False, True, None, None, "metadata", None, None, None,
                         t.data_ptr(), 9)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="Triton's compiled launchers exist on CUDA only")
def test_cached_generated_kernels_launch_through_the_c_launch_of_triton():
    """On the installed Triton, a cached call's bound launches hold the compiled launcher's C ``launch`` (none of
    pyfuser's generated kernels has global or profile scratch), and give eager's values."""
    fd = _build(_relu_add)
    a, b = make([33, 65]), make([33, 130])[:, ::2]
    for _ in range(2):
        (out,) = fd.execute([a, b])
    torch.testing.assert_close(out, torch.relu(a + b), rtol=0, atol=0)
    steps = _kernel_steps(fd)
    assert steps
    for step in steps:
        runners = list(step.launch._compiled.values())
        assert runners and all(type(run).__name__ == "builtin_function_or_method" and run.__name__ == "launch"
                               for run, _ in runners)


# --- the last runtime's input guard (runtime/input_guard.py) ---------------------------------------------------


def _scaled(fd):
    a = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
    n = fd.define_scalar(None, dtype=DataType.Int)
    s = fd.define_scalar(None, dtype=DataType.Double)
    fd.add_output(fd.ops.mul(fd.ops.add(a, n), s))


def test_a_repeated_call_is_recognized_by_the_guard_without_a_signature(monkeypatch):
    fd = _build(_scaled)
    a = make([4, 6])
    fd.execute([a, 2, 0.5])
    guard = fd._executor.last_runtime.input_guard
    if not guard:
        pytest.skip("torch has no usable TensorGuards: every call takes the signature path")

    def no_signature(inputs):
        raise AssertionError("a repeated call computed its signature")

    monkeypatch.setattr(executor_cache, "flat_signature", no_signature)
    for s in (0.5, 3.0, -1.0):  # a float's value is not part of the signature: the guard does not bake it
        b = make([4, 6])
        torch.testing.assert_close(fd.execute([b, 2, s])[0], (b + 2) * s)
    assert fd._executor.stats["hits"] == 3


def test_the_guard_rejects_every_change_of_the_signature():
    from pyfuser.runtime.input_guard import InputGuard

    a = make([4, 6])
    guard = InputGuard.build(0, None, [a, 2, 0.5])
    if guard is None:
        pytest.skip("torch has no usable TensorGuards")
    assert guard.matches([make([4, 6]), 2, 7.0])
    changed = {
        "stride": [make([6, 4]).t(), 2, 0.5],
        "dtype": [make([4, 6], dtype=torch.float64), 2, 0.5],
        "shape": [make([4, 5]), 2, 0.5],
        "alignment": [make([25])[1:].view(4, 6), 2, 0.5],
        "negative bit": [torch._neg_view(make([4, 6])), 2, 0.5],
        "device": [make([4, 6], device="meta"), 2, 0.5],
        "requires_grad": [make([4, 6]).requires_grad_(), 2, 0.5],
        "int value": [a, 3, 0.5],
        "bool for int": [a, True, 0.5],
        "numpy int": [a, np.int64(2), 0.5],
        "int for float": [a, 2, 1],
        "tensor for scalar": [a, make([1]), 0.5],
        "scalar for tensor": [1.0, 2, 0.5],
        "nested list": [a, [2], 0.5],
        "count": [a, 2],
    }
    for what, inputs in changed.items():
        assert not guard.matches(inputs), what
    misaligned_ok = InputGuard.build(0, None, [make([25])[1:].view(4, 6), 2, 0.5])
    assert misaligned_ok.matches([make([25])[1:].view(4, 6), 2, 0.5])
    assert not misaligned_ok.matches([make([4, 6]), 2, 0.5])  # 16-byte aligned: another alignment class


def test_alternating_signatures_and_options_take_their_own_runtimes():
    fd = _build(_relu_add)
    small, large = (make([2, 3]), make([2, 3])), (make([5, 7]), make([5, 7]))
    for i in range(6):
        x, y = small if i % 2 else large
        torch.testing.assert_close(fd.execute([x, y])[0], torch.relu(x + y))
        out = fd.execute([x, y], _disable_options=["kernel_codegen"])[0]
        torch.testing.assert_close(out, torch.relu(x + y))
        assert fd.last_execution()[0].runs_as == "aten"
    assert _runtimes(fd) == 4


def test_without_tensor_guards_every_call_takes_the_signature_path(monkeypatch):
    from pyfuser.runtime import input_guard

    monkeypatch.setattr(input_guard, "_probed", True)
    monkeypatch.setattr(input_guard, "_tensor_guards", None)
    fd = _build(_scaled)
    a = make([4, 6])
    for n, s in ((2, 0.5), (2, 1.5), (3, 1.5)):
        torch.testing.assert_close(fd.execute([a, n, s])[0], (a + n) * s)
    assert fd._executor.last_runtime.input_guard is False
    assert _runtimes(fd) == 2


def test_autograd_is_off_during_a_call_and_restored_after_it():
    def fusion(fd):  # an ATen step (matmul) between two kernels
        t = fd.define_tensor([-1], contiguity=[True], dtype=DataType.Float)
        m = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(fd.ops.matmul(m, fd.ops.relu(t)), 2.0))

    fd = _build(fusion)
    t, m = make([4]).requires_grad_(), make([3, 4]).requires_grad_()
    for grad in (True, False, True):
        with torch.set_grad_enabled(grad):
            out = fd.execute([t, m])[0]
            assert torch.is_grad_enabled() is grad
        assert not out.requires_grad and out.grad_fn is None
        torch.testing.assert_close(out, (m.detach() @ torch.relu(t.detach())) * 2.0)
    with pytest.raises(Exception):
        fd.execute([t, make([3, 5])])  # fails inside the run (a new signature: validation passes, matmul fails)
    assert torch.is_grad_enabled()


def test_a_tuple_argument_is_keyed_by_its_items_and_passed_raw(monkeypatch):
    """A load prologue's argument tuple (pointers and integers): its key and raw form are built in one pass."""
    from pyfuser.codegen import launcher as launcher_mod

    compiles, runs = [], []
    monkeypatch.setattr(launcher_mod.BoundLaunch, "_launch",
                        lambda self, tensors, scalars, jit: compiles.append(scalars)
                        or launcher_mod.compiled_runner(_RecordingCompiled(runs)))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(launcher_mod, "_launch_hooks_installed", lambda: False)
    bound = launcher_mod.Launcher(None, 4).bind((2,), (9,), torch.device("cuda", 0))
    bound.tuple_scalars = True
    base = torch.empty(64)
    out, a, b = base[:16], base[16:32], base[32:48]

    def call(*items):
        bound([out], (tuple(items), 5))

    call(a, 4096, 3)
    call(b, 8192, 5)  # same dtypes, alignment and int specs: the same specialization, new values passed
    assert len(compiles) == 1
    assert runs[-1][9:] == (out.data_ptr(), (b.data_ptr(), 8192, 5), 5, 9)
    call(base[33:49], 8192, 5)  # a tuple pointer off 16 bytes
    call(b.double(), 8192, 5)  # another dtype
    call(b, 8193, 5)  # an int no longer a multiple of 16
    call(b, 8192, 1)  # an int equal to 1
    call(b, 2**31, 5)  # an int outside int32
    assert len(compiles) == 6
    call(b, 16, 3)
    assert len(compiles) == 6 and runs[-1][10] == (b.data_ptr(), 16, 3)
    assert launcher_mod._scalar_spec((a, 4096, 3)) == launcher_mod._tuple_spec_and_raw((a, 4096, 3))[0]
    assert launcher_mod._raw((a, 4096, 3)) == (a.data_ptr(), 4096, 3)


def test_a_guard_keeps_no_input_alive_and_is_cache_compatible():
    import gc
    import weakref

    fd = _build(_relu_add)
    a, b = make([64, 64]), make([64, 64])
    fd.execute([a, b])
    fd.execute([a, b])
    refs = [weakref.ref(a), weakref.ref(b)]
    del a, b
    gc.collect()
    assert all(r() is None for r in refs), "a runtime's input guard must not keep the call's tensors alive"
    c, d = make([64, 64]), make([64, 64])
    assert fd.fec.is_compiled([c, d])
    assert not fd.fec.is_compiled([c, make([64, 63])])
    torch.testing.assert_close(fd.execute([c, d])[0], torch.relu(c + d))
