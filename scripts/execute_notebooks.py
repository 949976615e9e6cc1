"""Execute the notebooks top to bottom in a fresh kernel on CPU and save them with their outputs.

    python scripts/execute_notebooks.py                      # notebooks/0*.ipynb, in place
    python scripts/execute_notebooks.py notebooks/05_*.ipynb --timeout 300 --out /tmp/executed

Widgets are saved twice, so that a committed notebook shows its pictures before anyone runs it:
- their state, in the notebook's metadata (nbclient's ``store_widget_state``): JupyterLab draws
  the widgets from it, but only in a *trusted* notebook, and a freshly cloned one is not;
- a static picture: each widget output also gets an ``image/png``, the widget's Image values
  stacked top to bottom. Renderers that cannot show a widget (an untrusted notebook in
  JupyterLab, GitHub, nbviewer) show this picture instead of ``VBox(children=...)``; live
  widgets still take precedence wherever they can render.

A notebook that raises, or runs past ``--timeout`` seconds, is reported and left unchanged.
Exit status: the number of notebooks that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def widget_pngs(model_id: str, state: dict) -> list[bytes]:
    """PNG values of the Image widgets in a widget and its children, in display order."""
    model = state.get(model_id)
    if model is None:
        return []
    if model["model_name"] == "ImageModel" and model["state"].get("format", "png") == "png":
        return [base64.b64decode(b["data"]) for b in model.get("buffers", []) if b["path"] == ["value"]]
    children = model["state"].get("children", [])
    return [png for child in children for png in widget_pngs(child.removeprefix("IPY_MODEL_"), state)]


def stack_pngs(pngs: list[bytes]) -> bytes:
    """One PNG: the pictures one below the other, left-aligned on white."""
    if len(pngs) == 1:
        return pngs[0]
    from PIL import Image  # matplotlib's dependency

    images = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
    sheet = Image.new("RGB", (max(im.width for im in images), sum(im.height for im in images)), "white")
    top = 0
    for im in images:
        sheet.paste(im, (0, top))
        top += im.height
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=True)
    # what each picture says (minipaged.viz.style.figure_png puts it in the PNG) goes on with the sheet
    from minipaged.viz.style import png_text, png_with_text

    texts = [text for png in pngs if (text := png_text(png))]
    return png_with_text(out.getvalue(), "\n".join(texts)) if texts else out.getvalue()


def add_static_pictures(nb) -> int:
    """Give every widget output of ``nb`` an image/png of its Image widgets; returns how many got one."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    added = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view and (pngs := widget_pngs(view["model_id"], state)):
                out["data"]["image/png"] = base64.b64encode(stack_pngs(pngs)).decode()
                added += 1
    return added


def execute(path: Path, timeout: float, kernel_name: str) -> tuple[object, int]:
    """Run ``path`` in a fresh kernel (cwd: its folder); returns the executed notebook and pictures added."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        store_widget_state=True,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    asyncio.run(asyncio.wait_for(client.async_execute(), timeout))
    return nb, add_static_pictures(nb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/0*.ipynb)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per notebook (default 300)")
    parser.add_argument("--out", type=Path, help="write the executed notebooks to this folder instead of in place")
    parser.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("0*.ipynb"))
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU, as the committed outputs were made; inherited by kernels
    failed = 0
    for i, path in enumerate(paths, 1):
        head = f"[{i}/{len(paths)}] {path.name}:"
        print(f"{head} running (timeout {args.timeout:.0f} s)", flush=True)
        start = time.monotonic()
        try:
            nb, pictures = execute(path, args.timeout, args.kernel)
        except Exception as e:  # a cell's error, the time limit (cancelling may surface as "Kernel died")
            failed += 1
            elapsed = time.monotonic() - start
            timed_out = elapsed >= args.timeout
            why = f"TIMED OUT ({args.timeout:.0f} s)" if timed_out else f"FAILED after {elapsed:.0f} s:\n{e}"
            print(f"{head} {why}; left unchanged", flush=True)
            continue
        target = args.out / path.name if args.out else path
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        print(f"{head} ok in {time.monotonic() - start:.0f} s, {pictures} widget pictures -> {target}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
