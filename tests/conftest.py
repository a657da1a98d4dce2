import os
import sys

# Tests import the numpy reference (tests/np_ref.py) as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
