"""Small arithmetic shared by every layer (this module imports nothing from the package)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

# An int, or a tensor of them (divided elementwise).
Count = TypeVar("Count", int, "torch.Tensor")


def cdiv(a: Count, b: int) -> Count:
    """Ceiling division for non-negative ``a`` and positive ``b``: how many blocks of ``b`` hold ``a`` items."""
    return -(-a // b)
