"""Multi-device fusions on torch.distributed (docs/multidevice.md).

Importing the package attaches the sharding methods to TensorView and lets ``fd.execute`` run fusions that have
device meshes.
"""

from ..frontend import fusion_definition as _fusion_definition
from . import sharding as _sharding
from .execute import ShardedExecutor, execute_sharded, executor_for, output_placements  # noqa: F401
from .mesh import DeviceMesh, ParallelType, block_of  # noqa: F401
from .plan import build_plan, fusion_mesh  # noqa: F401

_sharding.attach()
_fusion_definition.SHARDED_EXECUTE = execute_sharded
