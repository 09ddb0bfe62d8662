"""The public import path `perfloop.kernel` (kernels and scripts use it): the kernel contract
(perfloop.core.kernel) and its manifest reader's load_spec."""

from perfloop.core.kernel import *  # noqa: F403
from perfloop.core.kernel import import_module, read_knobs, triton_competitor  # noqa: F401
from perfloop.core.manifest import load_spec  # noqa: F401
