"""nvFuser issue #4888 in miniature: why segment-boundary layouts are inferred on meta tensors.

A mask is broadcast to 4-D, sliced (dropping its last column) and expanded over heads. That view is a fusion
output, so it is produced by an ExprEval segment as a real ATen view, non-contiguous: each row keeps the original
row pitch. The softmax segment that reads it must know that. This script prints the layout the runtime inferred
for the view and the layout the old "ExprEval outputs are contiguous" assumption gives
(``_disable_options=["infer_contiguity"]``), and checks the view against eager PyTorch.
Run: ``python examples/issue4888_layouts.py``.
"""

import torch

from pyfuser import DataType, FusionDefinition

S, H = 16, 2


def define(mask: torch.Tensor) -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(mask)
        t1 = fd.ops.broadcast_in_dim(t0, shape=[1, 1, S, S + 1], broadcast_dims=[2, 3])
        t2 = fd.ops.slice(t1, start_indices=[0, 0, 0, 0], end_indices=[1, 1, S, S])
        view = fd.ops.broadcast_in_dim(t2, shape=[1, H, S, S], broadcast_dims=[0, 1, 2, 3])
        fd.add_output(view)
        fd.add_output(fd.ops.sum(fd.ops.cast(view, DataType.Float), dims=[3]))
    return fd


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mask = torch.randn(S, S + 1, device=device, dtype=torch.bfloat16)

    fd = define(mask)
    view, row_sums = fd.execute([mask])
    name = fd.fusion.outputs[0].name
    for seg in fd.segments():
        print(seg)
    inferred = fd.last_runtime().boundary_layouts()[name]
    print(f"{name} inferred: {inferred}")

    legacy_fd = define(mask)
    legacy_fd.execute([mask], _disable_options=["infer_contiguity"])
    print(f"{name} assumed without meta inference: {legacy_fd.last_runtime().boundary_layouts()[name]}")

    eager_view = mask[None, None, :, :S].expand(1, H, S, S)
    assert view.stride() == eager_view.stride() and view.data_ptr() == eager_view.data_ptr()
    assert list(inferred.contiguity) == [None, None, False, True]
    torch.testing.assert_close(row_sums, eager_view.float().sum(-1))
    print(f"OK: {name} is a view of the input with eager's strides {view.stride()}; contiguity [None, None, False, True]")


if __name__ == "__main__":
    main()
