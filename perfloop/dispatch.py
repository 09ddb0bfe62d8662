"""The public import path `perfloop.dispatch` (kernels and judges use it): the same module
as perfloop.contract.dispatch."""

import sys

from perfloop.contract import dispatch as _module

sys.modules[__name__] = _module
