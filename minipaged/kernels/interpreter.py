"""Where a kernel runs: compiled on a GPU, or in Triton's interpreter on the CPU.

Triton's interpreter executes a kernel's Python source with NumPy, one program after another:
slow, but it runs on CPU tensors, so the kernels can be read, stepped through and tested on a
machine without a GPU. Triton itself chooses at *decoration* time: ``@triton.jit`` returns an
interpreted function when ``TRITON_INTERPRET=1`` (``triton.knobs.runtime.interpret``) is set at
that moment, a compiled one otherwise. That ties the mode to import order (whoever imports
Triton first, e.g. ``torch._dynamo``, fixes it for ``triton.language``'s own helpers), so this
package decides per launch instead, from the tensors' device:

- :func:`interpreting` is ``True`` for tensors off CUDA, and for every device when the user
  asked for the interpreter (``TRITON_INTERPRET=1``);
- :func:`launch` runs ``kernel[grid](...)`` compiled, or through the interpreted twin of the
  same Python function. The environment is never changed.

:data:`INTERPRET` is the mode a launch on this machine's default device gets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_TRUE = ("1", "true", "yes", "on", "y")


def _user_asked_for_interpreter() -> bool:
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # Triton < 3.4 has no knobs and reads the variable only
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def interpreting(device: torch.device | str) -> bool:
    """Whether a launch on tensors of ``device`` runs in Triton's interpreter."""
    return torch.device(device).type != "cuda" or _user_asked_for_interpreter()


INTERPRET: bool = interpreting("cuda" if torch.cuda.is_available() else "cpu")

_TWINS: dict = {}


def _as(kernel: JITFunction | InterpretedFunction, kind: type) -> JITFunction | InterpretedFunction:
    """``kernel`` as a ``kind`` (compiled or interpreted), built once from its Python function."""
    if isinstance(kernel, kind):
        return kernel
    key = (kind, kernel.fn)
    if key not in _TWINS:
        _TWINS[key] = kind(kernel.fn)
    return _TWINS[key]


@contextmanager
def _interpretable_language() -> Iterator[None]:
    """Let an interpreted kernel call ``triton.language``'s own ``@triton.jit`` helpers.

    ``tl.zeros``, ``tl.max``, ``tl.sum``... are decorated once, when ``triton.language`` is
    first imported. If that happened with the interpreter off, they are compiled functions, which
    the interpreter refuses to call ("Cannot call @triton.jit'd outside of the scope of a
    kernel"). For the launch, the ``tl.`` names point to interpreted twins; the originals come
    back after. Only the ``tl.`` spelling is swapped (not ``x.max(1)``, not
    ``triton.language.standard``, which other parts of Triton read while it stays compiled).
    """
    swapped = {name: fn for name, fn in vars(tl).items() if isinstance(fn, JITFunction)}
    for name, fn in swapped.items():
        setattr(tl, name, _as(fn, InterpretedFunction))
    try:
        yield
    finally:
        for name, fn in swapped.items():
            setattr(tl, name, fn)


def launch(
    kernel: JITFunction | InterpretedFunction, grid: tuple, device: torch.device, *args: object, **constexprs: object
) -> None:
    """``kernel[grid](*args, **constexprs)``, compiled or interpreted as :func:`interpreting` says for ``device``."""
    if not interpreting(device):
        _as(kernel, JITFunction)[grid](*args, **constexprs)
        return
    with _interpretable_language():
        _as(kernel, InterpretedFunction)[grid](*args, **constexprs)
