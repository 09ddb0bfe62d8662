"""The public import path `perfloop.kernel` (kernels and scripts use it): the kernel contract
(perfloop.contract.kernel) and its manifest reader's load_spec."""

from perfloop.contract.kernel import *  # noqa: F403
from perfloop.contract.kernel import import_module, read_knobs, triton_competitor  # noqa: F401
from perfloop.contract.manifest import load_spec  # noqa: F401
