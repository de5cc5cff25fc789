"""The `jupyter nbrewind` commands, run as the console script would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbrewind.store import CellRun, Store


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbrewind.cli", *args], capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    with Store.open(root) as opened:
        keep = opened.objects.put_blob(os.urandom(3_000_000))
        opened.objects.put(b"orphan")
        run = opened.catalog.add_cell_run(CellRun(session="s", kernel="audit", execution_count=1, code="x = 1", decision="executed", reason="r", status="ok"))
        opened.catalog.add_checkpoint(run, None, {"x": (keep, {"kind": "value"})})
    return root


def test_install_writes_specs_that_start_this_interpreter(tmp_path: Path) -> None:
    out = cli("install", "--prefix", str(tmp_path), "--json")
    specs = json.loads(out.stdout)
    assert {s["name"] for s in specs} == {"nbrewind-audit", "nbrewind-repeat"}
    for name in ("nbrewind-audit", "nbrewind-repeat"):
        folder = tmp_path / "share" / "jupyter" / "kernels" / name
        spec = json.loads((folder / "kernel.json").read_text())
        assert spec["argv"][0] == sys.executable and spec["argv"][2] == f"nbrewind.kernels.{name.split('-')[1]}"
        assert spec["display_name"] == f"NBRewind ({name.split('-')[1]})"
        assert {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"} <= {p.name for p in folder.iterdir()}


def test_du_verify_gc_and_log(store: Path) -> None:
    du = json.loads(cli("du", "--store", str(store), "--json").stdout)
    assert du["objects"] >= 3 and du["stored_bytes"] > 0
    assert cli("verify", str(store)).returncode == 0
    dry = json.loads(cli("gc", "--store", str(store), "--json").stdout)
    assert dry["dry_run"] is True
    log = json.loads(cli("log", "--store", str(store), "--json").stdout)
    assert [r["code"] for r in log["cell_runs"]] == ["x = 1"]
    assert "executed" in cli("log", "--store", str(store)).stdout


def test_verify_exits_1_and_names_a_corrupt_object(store: Path) -> None:
    with Store.open(store) as opened:
        digest = next(d for d in opened.objects.iter_digests() if opened.objects.stored_size(d) > 1000)
        path = opened.objects.path_of(digest)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    result = cli("verify", str(store), check=False)
    assert result.returncode == 1 and digest in result.stdout


def test_a_folder_that_is_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "stuff.txt").write_text("not a store")
    result = cli("du", "--store", str(tmp_path), check=False)
    assert result.returncode == 2 and "not an NBRewind store" in result.stderr  # a bad input
