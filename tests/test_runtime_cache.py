"""The executor cache: signature hits do no meta work, misses are keyed on what changes layouts."""

import threading

import pytest
import torch

import pyfuser
from pyfuser import DataType, FusionDefinition
from pyfuser.errors import InputValidationError
from pyfuser.runtime import meta_inference
from pyfuser.runtime.executor_cache import alignment_class, input_signature

from harness import DEVICE, make


def relu_add(fd):
    t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    fd.add_output(fd.ops.relu(fd.ops.add(t0, t1)))


def build(fn):
    with FusionDefinition() as fd:
        fn(fd)
    return fd


def inferred():
    return meta_inference.STATS["segments_inferred"]


def test_repeated_call_does_no_meta_work():
    fd = build(relu_add)
    a, b = make([8, 16]), make([8, 16])
    fd.execute([a, b])
    before = inferred()
    for _ in range(5):
        out = fd.execute([a, b])[0]
    assert inferred() == before, "a signature hit must not run meta inference"
    assert fd._executor.stats["hits"] == 5
    torch.testing.assert_close(out, torch.relu(a + b))


def test_new_buffers_with_the_same_signature_hit():
    fd = build(relu_add)
    fd.execute([make([8, 16]), make([8, 16])])
    before = inferred()
    out = fd.execute([make([8, 16]), make([8, 16])])
    assert inferred() == before
    assert fd._executor.num_runtimes() == 1
    assert out[0].shape == (8, 16)


def test_new_shape_builds_a_new_runtime():
    fd = build(relu_add)
    fd.execute([make([8, 16]), make([8, 16])])
    before = inferred()
    a, b = make([8, 15]), make([8, 15])
    out = fd.execute([a, b])[0]
    assert inferred() > before
    assert fd._executor.num_runtimes() == 2
    torch.testing.assert_close(out, torch.relu(a + b))


def test_alignment_is_part_of_the_signature():
    base = make([8 * 16 + 1])
    aligned = base[:128].view(8, 16)
    misaligned = base[1:129].view(8, 16)  # 4 bytes into the allocation
    assert alignment_class(aligned.data_ptr()) == 16
    assert alignment_class(misaligned.data_ptr()) == 4
    assert input_signature([aligned]) != input_signature([misaligned])
    fd = build(relu_add)
    other = make([8, 16])
    torch.testing.assert_close(fd.execute([aligned, other])[0], torch.relu(aligned + other))
    torch.testing.assert_close(fd.execute([misaligned, other])[0], torch.relu(misaligned + other))
    assert fd._executor.num_runtimes() == 2


def test_options_are_part_of_the_signature():
    fd = build(relu_add)
    a, b = make([4, 4]), make([4, 4])
    fd.execute([a, b])
    fd.execute([a, b], _disable_options=["infer_contiguity"])
    assert fd._executor.num_runtimes() == 2


def test_scalar_values_only_matter_for_integers():
    def fusion(fd):
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        s = fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.mul(t0, s))

    fd = build(fusion)
    a = make([6])
    fd.execute([a, 2.0])
    before = inferred()
    out = fd.execute([a, 3.0])[0]
    assert inferred() == before, "a float scalar's value must not cause meta work"
    torch.testing.assert_close(out, a * 3.0)


def test_failed_execute_leaves_the_cache_usable():
    fd = build(relu_add)
    a, b = make([4, 5]), make([4, 5])
    with pytest.raises(InputValidationError):
        fd.execute([a, make([4, 5]).t()])  # transposed: contradicts contiguity [True, True]
    with pytest.raises(InputValidationError):
        fd.execute([a])
    assert fd._executor.num_runtimes() == 0
    torch.testing.assert_close(fd.execute([a, b])[0], torch.relu(a + b))


def test_lru_cache_shares_executors_between_equal_fusions():
    cache = pyfuser.LRUCache(max_fusions=8)
    fec1 = cache.cache_compile(build(relu_add))
    fec2 = cache.cache_compile(build(relu_add))
    assert fec1 is fec2
    assert cache.num_fusions() == 1
    a, b = make([3, 3]), make([3, 3])
    torch.testing.assert_close(fec2.execute([a, b])[0], torch.relu(a + b))


def test_concurrent_execution_is_correct():
    fd = build(relu_add)
    shapes = [[4, 4], [4, 5], [6, 3], [2, 9]]
    errors = []
    calls = []

    def worker(seed):
        # Any exception (a crash in execute, a wrong value) is recorded: a thread's exception would otherwise
        # only be printed, and the test would pass.
        try:
            g = torch.Generator(device="cpu").manual_seed(seed)
            for i in range(20):
                shape = shapes[(seed + i) % len(shapes)]
                a = torch.randn(shape, generator=g).to(DEVICE)
                b = torch.randn(shape, generator=g).to(DEVICE)
                out = fd.execute([a, b])[0]
                calls.append(seed)
                if not torch.equal(out, torch.relu(a + b)):
                    errors.append(f"thread {seed}, call {i}: wrong values for shape {shape}")
        except BaseException as e:  # noqa: BLE001  (reported below, with the thread that raised it)
            errors.append(f"thread {seed}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)
    assert len(calls) == 4 * 20
    assert fd._executor.num_runtimes() == len(shapes)


def test_numpy_integer_scalars_key_on_their_value():
    np = pytest.importorskip("numpy")

    def fusion(fd):
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        n0 = fd.define_scalar(None, dtype=DataType.Int)
        n1 = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.reshape(t0, [n0, n1]))

    fd = build(fusion)
    x = make([12])
    assert fd.execute([x, np.int64(3), np.int64(4)])[0].shape == (3, 4)
    assert fd.execute([x, np.int64(6), np.int64(2)])[0].shape == (6, 2)
    assert fd._executor.num_runtimes() == 2
