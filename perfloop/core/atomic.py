"""Atomic file writes: a reader sees the old file or the new one, never half of either. JSON is
written strictly: NaN and infinities become null, so every file is valid JSON."""

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # as open() would create it, not 0600
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite(value):
    """The value with every NaN or infinite float replaced by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data, **kw) -> str:
    return json.dumps(finite(data), allow_nan=False, **kw)


def json_bytes(data) -> bytes:
    """What write_json writes."""
    return (dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")


def write_json(path: Path, data) -> None:
    write_bytes(path, json_bytes(data))


def digest(data: bytes) -> str:
    """How a child names the task file it read, so its parent can tell it was the one it wrote."""
    return hashlib.sha256(data).hexdigest()
