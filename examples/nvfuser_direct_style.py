"""nvFuser direct code, run by pyfuser: a definition written the way nvFuser's tests write them.

Shows ``import pyfuser as nvfuser_direct``, an explicit ``define_tensor`` with contiguity and stride_order (a
column-major input), the printed definition re-executed, and an ``LRUCache`` sharing one executor between two
equal definitions. Run: ``python examples/nvfuser_direct_style.py``.
"""

import torch

import pyfuser as nvfuser_direct
from pyfuser import DataType, FusionDefinition


def nvfuser_fusion(fd: FusionDefinition) -> None:
    # x is [M, N] stored column-major: stride_order [0, 1] puts dim 0 innermost.
    x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Half, stride_order=[0, 1])
    bias = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Half)
    y = fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.broadcast_in_dim(bias, shape=fd.ops.shape(x), broadcast_dims=[1]))
    fd.add_output(fd.ops.cast(fd.ops.relu(y), DataType.Half))


def eager(x, bias):
    return torch.relu(x.float() + bias.float()).half()


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(32, 48, device=device, dtype=torch.half).t().contiguous().t()  # column-major [32, 48]
    bias = torch.randn(48, device=device, dtype=torch.half)

    with FusionDefinition() as fd:
        nvfuser_fusion(fd)
    (out,) = fd.execute([x, bias])
    ref = eager(x, bias)
    print(fd)
    print("segments:", fd.segments())
    print(f"output strides {out.stride()}, eager {ref.stride()}")  # a pointwise op keeps eager's column-major layout
    torch.testing.assert_close(out, ref)
    assert out.stride() == ref.stride()

    # The printed definition is runnable Python that rebuilds the same fusion.
    scope = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(repr(fd), scope)
    with FusionDefinition() as fd2:
        scope["nvfuser_fusion"](fd2)
    assert repr(fd2) == repr(fd)

    # Equal definitions share one executor through an LRUCache.
    cache = nvfuser_direct.LRUCache(max_fusions=8)
    fec = cache.cache_compile(fd)
    assert cache.cache_compile(fd2) is fec and cache.num_fusions() == 1
    torch.testing.assert_close(fec.execute([x, bias])[0], ref)
    print("OK: eager values and strides, repr round trip, LRUCache shared by equal fusions")


if __name__ == "__main__":
    main()
