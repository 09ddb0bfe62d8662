"""Knob values as perfloop compares them: JSON and TOML arrays become tuples (hashable,
comparable), and back to lists for JSON."""


def freeze(value):
    """JSON and TOML arrays become tuples, so knob values can be compared and hashed."""
    return tuple(freeze(v) for v in value) if isinstance(value, list) else value


def thaw(value):
    """The inverse of freeze, for JSON."""
    return [thaw(v) for v in value] if isinstance(value, tuple) else value
