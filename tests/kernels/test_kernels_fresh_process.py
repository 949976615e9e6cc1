"""Stage 4 in fresh interpreters: what depends on import order, the environment or the package layout.

Triton fixes some things when it is first imported (``triton.language``'s own ``@triton.jit``
helpers are built compiled or interpreted then), so these tests start a new Python process each,
import in the order a user might, and check the kernels against the torch reference there.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# Each test starts Python afresh and imports torch and Triton there: seconds apiece.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "minipaged" / "kernels"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _python(code: str | Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` (source, or a script file) in a fresh interpreter, TRITON_INTERPRET unset unless given."""
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ.update(env)
    args = [str(code)] if isinstance(code, Path) else ["-c", textwrap.dedent(code)]
    return subprocess.run([sys.executable, *args], env=environ, capture_output=True, text=True, timeout=600)


# A small batch through all three kernels, checked against the reference: GQA 4:1, two blocks of 8
# per sequence, prefill of 5 and 3 new tokens, then decode; fp32 and bf16.
KERNELS_MATCH_REFERENCE = """
    import os, sys, torch
    from minipaged import kernels
    from minipaged.attention import reference
    device = "{device}"
    assert "TRITON_INTERPRET" not in os.environ, "importing the kernels changed the environment"
    g = torch.Generator().manual_seed(0)
    for dtype, atol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        k_cache = torch.zeros(6, 8, 2, 64, dtype=dtype, device=device)
        v_cache = torch.zeros_like(k_cache)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        tables = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=device)
        ctx = torch.tensor([13, 9], dtype=torch.int32, device=device)
        slots = torch.tensor([4 * 8 + i for i in range(8)] + [1 * 8 + i for i in range(5)]
                             + [i for i in range(8)] + [5 * 8], device=device)
        key = torch.randn(22, 2, 64, generator=g).to(device)
        value = torch.randn(22, 2, 64, generator=g).to(device)
        kernels.store_kvcache(key, value, k_cache, v_cache, slots)
        reference.store_kvcache(key, value, k_ref, v_ref, slots)
        assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "store_kvcache"
        q = torch.randn(8, 8, 64, generator=g).to(dtype).to(device)
        cu = torch.tensor([0, 5, 8], dtype=torch.int32, device=device)
        out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx)
        ref = reference.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx)
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
        out = kernels.paged_decode_attention(q[:2], k_cache, v_cache, tables, ctx)
        ref = reference.paged_decode_attention(q[:2], k_cache, v_cache, tables, ctx)
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
    assert "TRITON_INTERPRET" not in os.environ
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    if not kernels.interpreting("cuda"):  # Triton's own helpers are left as they were built: compiled
        assert isinstance(tl.zeros, JITFunction) and isinstance(tl.max, JITFunction)
    print("kernels match the reference")
"""

TRITON_ALREADY_IMPORTED = """
import sys
if "triton" not in sys.modules:  # the precondition of the test
    print("SKIP: this torch did not import Triton here")
    sys.exit()
"""
IMPORTS_TRITON_FIRST = {
    "import torch._dynamo": "import torch._dynamo",
    "meta-device model": "import torch\nwith torch.device('meta'):\n    torch.nn.Embedding(10, 4)",
}


@pytest.mark.parametrize("first", IMPORTS_TRITON_FIRST.values(), ids=IMPORTS_TRITON_FIRST.keys())
def test_kernels_work_whatever_imported_triton_first(first):
    """Regression: Triton imported (interpreter off) before minipaged.kernels made every kernel
    on CPU tensors fail with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    result = _python(first + TRITON_ALREADY_IMPORTED + textwrap.dedent(KERNELS_MATCH_REFERENCE.format(device=DEVICE)))
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0 and "kernels match the reference" in result.stdout, result.stdout + result.stderr


def test_triton_backend_generates_what_the_torch_backend_generates():
    """Through the public API in a fresh process: the engine builds its model on the meta device
    (which imports Triton) before the Triton backend imports the kernels."""
    result = _python("""
        import sys
        from minipaged import LLM, SamplingParams
        from minipaged.tiny.task import prompt_for

        prompts = [prompt_for("paged kv"), prompt_for("ab1", "xyz ")]
        params = SamplingParams(temperature=0, max_tokens=8)
        texts = {}
        for backend in ("triton", "torch"):
            llm = LLM(attention_backend=backend, block_size=4, num_kvcache_blocks=32, max_num_seqs=2)
            outputs = llm.generate(prompts, params, use_tqdm=False)
            texts[backend] = [o.outputs[0].token_ids for o in outputs]
        assert "minipaged.kernels" in sys.modules
        assert texts["triton"] == texts["torch"], texts
        assert all(len(ids) > 0 for ids in texts["torch"]), texts
        print("same tokens", texts["triton"])
    """)
    assert result.returncode == 0 and "same tokens" in result.stdout, result.stdout + result.stderr


def test_importing_the_kernels_leaves_the_environment_and_the_torch_path_alone():
    result = _python("""
        import os, sys, torch
        before = dict(os.environ)
        import minipaged
        from minipaged.kernels import choose
        assert "triton" not in sys.modules, "import minipaged must not import triton"
        assert choose.get_backend("torch").name == "torch" and "triton" not in sys.modules, "torch loaded triton"
        import minipaged.kernels as k
        assert dict(os.environ) == before, "importing minipaged.kernels changed os.environ"
        assert "triton" not in sys.modules, "the package's names load on first use"
        assert k.INTERPRET == (not torch.cuda.is_available()), k.INTERPRET
        assert "triton" in sys.modules
        assert k.interpreting("cpu") and k.interpreting(torch.device("cpu"))
        assert isinstance(choose.get_backend("triton"), k.TritonBackend)
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


def test_interpreter_on_request_on_every_device():
    """TRITON_INTERPRET=1 (the user's choice) sends CUDA tensors to the interpreter too."""
    result = _python(
        "import minipaged.kernels as k; assert k.interpreting('cuda') and k.INTERPRET; print('ok')",
        TRITON_INTERPRET="1",
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


def test_kernel_modules_do_not_import_the_package():
    """No cycle: ``minipaged/kernels/__init__.py`` imports its submodules, never the reverse
    (a submodule imports a sibling by its full name, e.g. ``from minipaged.kernels._checks import ...``)."""
    for path in sorted(KERNELS.glob("*.py")):
        if path.stem == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "minipaged.kernels", f"{path.name} imports from the package __init__"
            if isinstance(node, ast.Import):
                assert all(alias.name != "minipaged.kernels" for alias in node.names), path.name
    result = _python("import minipaged.kernels.store as s, minipaged.kernels.paged_attention as p; print('ok')")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_kernels_compile_for_a_gpu_ahead_of_time():
    """Build PTX for sm_90 with the interpreter off (tests/kernels/kernels_aot_compile.py): catches what
    only a GPU compile rejects (tl.dot shapes, non-power-of-two ranges, type errors)."""
    result = _python(
        REPO / "tests" / "kernels" / "kernels_aot_compile.py", TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1"
    )
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0 and "compiled" in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("chars of PTX") == 4
