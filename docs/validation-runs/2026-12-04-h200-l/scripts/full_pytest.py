"""pytest with attention.GLUON_FULL on: every path the Gluon decode builds takes it."""
import sys
import pytest
from nvfp4compat.kernels.triton import attention as att
att.GLUON_FULL = True
sys.exit(pytest.main(sys.argv[1:]))
