"""Argument checks the API shares; each error names the argument and its value."""
from __future__ import annotations


def positive_int(name: str, value, *, optional: bool = False) -> None:
    """Raises ValueError unless ``value`` is an int >= 1 (not a bool), or None when
    ``optional``."""
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if optional else ''}, "
                         f"got {value!r}")
