"""The public import path `perfloop.kernel` (kernels and judges use it): the same module
as perfloop.core.kernel."""

import sys

from perfloop.core import kernel as _module

sys.modules[__name__] = _module
