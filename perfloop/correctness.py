"""The public import path `perfloop.correctness` (kernels and judges use it): the same module
as perfloop.contract.judge_api."""

import sys

from perfloop.contract import judge_api as _module

sys.modules[__name__] = _module
