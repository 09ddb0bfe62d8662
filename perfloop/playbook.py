"""The public import path `perfloop.playbook` (kernels and judges use it): the same module
as perfloop.contract.playbook."""

import sys

from perfloop.contract import playbook as _module

sys.modules[__name__] = _module
