"""The public import path `perfloop.autotune` (kernels and judges use it): the same module
as perfloop.core.autotune."""

import sys

from perfloop.core import autotune as _module

sys.modules[__name__] = _module
