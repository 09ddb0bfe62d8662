"""Whether Python source compiles, read without running any of it."""

from __future__ import annotations


def compile_error(source: str, where: str) -> str | None:
    """Why `source` does not compile as Python, in a few words, or None. Compiling runs none
    of its code."""
    try:
        compile(source, where, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{type(exc).__name__}: {exc.msg}, line {exc.lineno}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
