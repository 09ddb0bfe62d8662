"""perfloop: make cuTile kernels faster one measured experiment at a time."""

__version__ = "0.1.0"
