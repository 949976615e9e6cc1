"""Compile every Triton kernel of minipaged to PTX for sm_90, ahead of time, with no GPU.

Run by ``tests/kernels/test_kernels_fresh_process.py`` in a fresh interpreter with ``TRITON_INTERPRET=0``
(``@triton.jit`` must build compiled functions). It catches what only a GPU compile rejects
(``tl.dot`` shapes, non-power-of-two ranges, type errors the interpreter lets through), using
the wrappers' own GPU tile choices (``kernel_constexprs(..., interpret=False)``).

Prints ``SKIP: ...`` and exits 0 on a Triton without ``ASTSource(constexprs=...)``; otherwise
one line per compiled kernel and ``compiled`` at the end.
"""

from __future__ import annotations

import inspect
import sys

import torch
import triton

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as e:
    print("SKIP: this Triton has no ASTSource/GPUTarget:", e)
    sys.exit(0)
if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
    print("SKIP: this Triton's ASTSource takes no constexprs=")
    sys.exit(0)

from triton.runtime.jit import JITFunction

from minipaged.kernels import paged_attention, store

TARGET = GPUTarget("cuda", 90, 32)
TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_to_ptx(kernel: JITFunction, constexprs: dict, pointers: dict, floats: tuple = ()) -> None:
    """Compile ``kernel`` with these constants; pointer arguments typed by ``pointers``, the
    scalars in ``floats`` fp32 and every other scalar i32."""
    assert isinstance(kernel, JITFunction), f"{kernel} is not a compiled kernel: unset TRITON_INTERPRET"
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in floats else "i32")
        for name in kernel.arg_names
    }
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=TARGET)
    assert ".entry" in compiled.asm["ptx"], "no PTX"
    shown = {name: str(value) for name, value in constexprs.items()}
    print(kernel.__name__, shown, len(compiled.asm["ptx"]), "chars of PTX")


# (dtype, num_heads, num_kv_heads, head_dim, max_q_len, decode): GQA 4:1 decode in fp16, an MHA
# prefill in bf16, and GQA 5:1 with a head_dim that is not a power of two in fp32.
for dtype, num_heads, num_kv_heads, head_dim, max_q_len, decode in [
    (torch.float16, 32, 8, 128, 1, True),
    (torch.bfloat16, 8, 8, 64, 300, False),
    (torch.float32, 5, 1, 80, 1, True),
]:
    pointers = {name: "*" + TRITON_TYPE[dtype] for name in ("Q", "K_cache", "V_cache", "Out")}
    pointers.update({name: "*i32" for name in ("block_tables", "context_lens", "cu_seqlens_q")})
    consts = paged_attention.kernel_constexprs(
        dtype, num_heads, num_kv_heads, head_dim, max_q_len, decode, interpret=False
    )
    compile_to_ptx(paged_attention._paged_attention_kernel, consts, pointers, floats=("scale_log2",))

pointers = {"Key": "*fp32", "Value": "*fp32", "K_cache": "*bf16", "V_cache": "*bf16", "slot_mapping": "*i64"}
compile_to_ptx(store._store_kvcache_kernel, store.store_constexprs(100, 8, 128, interpret=False), pointers)
print("compiled")
