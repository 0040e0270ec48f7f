"""An MoE layer with NVFP4 expert weights, as one pyfuser fusion, checked against bf16 and a torch emulation.

The layer lives in ``pyfuser/demo/moe_nvfp4.py`` (so that ``python -m pyfuser demo`` runs it too); this script is its
command line: ``python examples/moe_nvfp4.py [--tokens 16 --hidden 128 ...] [--quant split] [--print-fusion]``.
"""

from pyfuser.demo.moe_nvfp4 import main

if __name__ == "__main__":
    main()
