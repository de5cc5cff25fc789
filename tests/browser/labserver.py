"""A real JupyterLab server for the browser suite, started and stopped reliably.

The server listens on 127.0.0.1 only, on a free port, with a random token, and
gets its own config, data-free runtime and workspace folders so nothing from the
machine's Jupyter setup (or an earlier run) leaks in. Every process it starts
(the server and its kernels) carries a marker in its environment; teardown asks
the server to shut down, then kills its process group and any process still
carrying the marker, by pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER_VARIABLE = "NBREWIND_LAB_TEST_RUN"


def chromium_path() -> str | None:
    """The Chromium binary to drive: NBREWIND_CHROMIUM, else `chromium` on PATH."""
    explicit = os.environ.get("NBREWIND_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing_browser_tools() -> list[str]:
    """What the browser suite needs and cannot find."""
    missing = [
        f"the Python package {name!r}" for name in ("playwright", "jupyterlab") if importlib.util.find_spec(name) is None
    ]
    if chromium_path() is None:
        missing.append("a chromium binary (apt-get install chromium, or set NBREWIND_CHROMIUM)")
    return missing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LabServer:
    """A running `python -m jupyterlab` and how to reach it."""

    process: subprocess.Popen[bytes]
    port: int
    token: str
    root: Path
    log_path: Path
    marker: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """An authenticated URL for `path` (which starts with /)."""
        separator = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{separator}token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5) -> object:
        """Call the REST API with the token; returns the decoded JSON (or None)."""
        request = urllib.request.Request(
            self.base_url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def start_lab(base: Path, *, timeout: float = 90) -> LabServer:
    """Start JupyterLab serving `base/root` and wait until its API answers."""
    root = base / "root"
    config = base / "jupyter-config"
    for folder in (root, config / "labconfig", base / "runtime", base / "workspaces", base / "settings"):
        folder.mkdir(parents=True, exist_ok=True)
    # No news prompt: its notification could cover what the tests click.
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    token = secrets.token_hex(16)
    marker = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k != "NBREWIND_STORE"}  # the store must follow the notebook
    env.update(
        {
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
            "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
            "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
            MARKER_VARIABLE: marker,
        }
    )
    port = free_port()
    log_path = base / "jupyterlab.log"
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = LabServer(process, port, token, root, log_path, marker)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            stop_lab(server)
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            server.api("/api/status", timeout=2)
            return server
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            stop_lab(server)
            raise RuntimeError(f"JupyterLab did not answer within {timeout} s:\n{server.log_tail()}")
        time.sleep(0.25)


def _marked_pids(marker: str) -> list[int]:
    """Processes (other than this one) whose environment carries this run's marker."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_lab(server: LabServer, *, grace: float = 15) -> None:
    """Shut the server and its kernels down; kill whatever is left. Never raises."""
    process = server.process
    if process.poll() is None:
        try:
            server.api("/api/shutdown", method="POST", timeout=5)
        except (urllib.error.URLError, OSError, ValueError):
            pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=5)
    if Path("/proc").is_dir():
        _kill(_marked_pids(server.marker))  # kernels live in their own sessions


#: Debian's chromium, headless in a container: no sandbox, GPU or background traffic.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
UI_TIMEOUT_MS = 30_000


@contextlib.contextmanager
def running_lab(base: Path) -> Iterator[LabServer]:
    """A JupyterLab server in `base` for the duration of the block."""
    server = start_lab(base)
    try:
        yield server
    finally:
        stop_lab(server)


@contextlib.contextmanager
def browser_page(width: int, height: int) -> Iterator[Any]:
    """A page of headless Chromium (Playwright) with the suite's default timeout."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    assert executable is not None
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(UI_TIMEOUT_MS)
            yield page
        finally:
            browser.close()
    finally:
        playwright.stop()


def screenshots_dir(factory: Any) -> Path:
    """Where screenshots go: $NBREWIND_LAB_SCREENSHOTS (docs/images when refreshing them), else a temp folder."""
    path = Path(os.environ.get("NBREWIND_LAB_SCREENSHOTS") or factory.mktemp("screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path
