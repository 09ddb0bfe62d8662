"""The public import path `perfloop.kernel_tools` (kernels use it): the same module as
perfloop.contract.kernel_tools."""

import sys

from perfloop.contract import kernel_tools as _module

sys.modules[__name__] = _module
