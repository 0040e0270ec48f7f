import os
import sys

# The tests import the shared harness as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
