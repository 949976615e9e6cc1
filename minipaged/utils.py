"""Small arithmetic shared by every layer (this module imports nothing from the package)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ``a`` and positive ``b``: how many blocks of ``b`` hold ``a`` items."""
    return -(-a // b)
