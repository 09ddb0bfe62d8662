"""The public import path `perfloop.autotune` (kernels and judges use it): the same module
as perfloop.contract.autotune."""

import sys

from perfloop.contract import autotune as _module

sys.modules[__name__] = _module
