"""Drive JupyterLab in headless Chromium: a private server, a notebook page, its widgets.

The server runs with its own config, data, runtime, settings and workspace folders (so a
developer's settings, trusted-notebook database or open tabs change nothing), on a free
localhost port with a random token. Every wait is for an event (the server answers, the page
shows a state); its bound is a hang guard, far above what a busy machine needs: a hung kernel
fails the test, a slow one does not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

JS = Path(__file__).with_name("page.js").read_text()

# Lab settings that make a page predictable: every cell in the DOM (no virtual scrolling),
# no news / update pop-ups over the notebook.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def find_chromium() -> str | None:
    """Path of a Chromium-family browser: $MINIPAGED_CHROMIUM, else the first one on PATH."""
    if os.environ.get("MINIPAGED_CHROMIUM"):
        return os.environ["MINIPAGED_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """``jupyter lab`` serving ``root`` from this Python, with private Jupyter folders under ``home``."""

    def __init__(self, root: Path, home: Path, start_timeout: float = 300):
        self.root, self.home, self.start_timeout = root, home, start_timeout
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(home / "config"),
            JUPYTER_DATA_DIR=str(home / "data"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
        )
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> JupyterLab:
        for plugin, values in SETTINGS.items():
            path = self.home / "settings" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            f"--LabApp.user_settings_dir={self.home / 'settings'}",
            f"--LabApp.workspaces_dir={self.home / 'workspaces'}",
        ]
        self.log = (self.home / "jupyterlab.log").open("w")
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"jupyter lab did not answer within {self.start_timeout} s:\n{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return (self.home / "jupyterlab.log").read_text()[-chars:]

    def notebook_url(self, name: str) -> str:
        """The notebook alone in a workspace of its own (no tabs restored from another test)."""
        workspace = name.removesuffix(".ipynb").replace("/", "-")
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?token={self.token}"

    def shutdown_kernels(self) -> None:
        api = f"{self.url}/api/kernels"
        with urllib.request.urlopen(f"{api}?token={self.token}", timeout=120) as r:
            kernels = json.load(r)
        for kernel in kernels:
            req = urllib.request.Request(f"{api}/{kernel['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(req, timeout=120).close()


class NotebookPage:
    """One notebook opened in a fresh Playwright page, with page.js installed as window.minipaged."""

    def __init__(self, context, lab: JupyterLab, name: str, timeout_ms: int = 300_000):
        self.lab, self.name, self.timeout_ms = lab, name, timeout_ms
        self.page = context.new_page()
        self.page.add_init_script(JS)
        num_cells = len(json.loads((lab.root / name).read_text())["cells"])
        try:
            self.page.goto(lab.notebook_url(name), timeout=timeout_ms)
            self.wait_for(f"window.minipaged.ready({num_cells})", "the notebook to open and its kernel to start")
        except Exception:
            self.close()
            raise

    def js(self, expression: str):
        """Evaluate a JS expression (awaited if it is a promise) in the page."""
        return self.page.evaluate(f"async () => {expression}")

    def wait_for(self, expression: str, what: str, timeout_ms: int | None = None) -> None:
        """Wait until the JS expression is truthy; on time-out fail with what was awaited and the page's state."""
        try:
            self.page.wait_for_function(f"() => {expression}", timeout=timeout_ms or self.timeout_ms, polling=250)
        except Exception as e:  # playwright's TimeoutError
            state = self.js("window.minipaged.panel() ? window.minipaged.state() : 'no notebook panel'")
            raise AssertionError(
                f"{self.name}: timed out (a hang guard) waiting for {what}; page state: {state}"
            ) from e

    def run_all_cells(self, timeout_ms: int) -> None:
        """Run > Run All Cells, then wait until every code cell has run (or one has failed)."""
        # Select a cell (by its prompt, not its text: a link there would navigate) so the notebook is current.
        self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-InputPrompt").first.click()
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        self.wait_for("window.minipaged.runStarted()", "Run All Cells to start")
        self.wait_for("window.minipaged.runFinished()", "Run All Cells to finish", timeout_ms)

    def errors(self) -> list[str]:
        return self.js("window.minipaged.errors()")

    def close(self) -> None:
        self.page.close()
        self.lab.shutdown_kernels()
