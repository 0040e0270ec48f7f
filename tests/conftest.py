import os
import sys

# The tests import the shared harness as a plain module.
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402  (torch does not import triton)

# Without a GPU, generated Triton kernels run under Triton's interpreter: every kernel segment of every test is
# then a real generated kernel, run on CPU tensors. The variable must be set before triton is imported (its
# own library functions are jitted at import); pyfuser itself makes the interpreter compute what the GPU
# computes (pyfuser/codegen/interpreter_compat.py). PYFUSER_TEST_INTERPRET=0 runs kernel segments on ATen.
if not torch.cuda.is_available() and os.environ.get("PYFUSER_TEST_INTERPRET", "1") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
