"""The domain-notebook harness in --quick mode, as CI runs it: a correctness test.

Every notebook runs on python3, audit and repeat, and each edit scenario on repeat
and fresh on python3; every repeat's outputs must equal the fresh outputs and every
scenario with a known task-miss count (CTrend's "add 10 new stations" among them)
must recompute exactly that many tasks. Times are not checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Its own CI step (`python -m pytest -m harness`): on a loaded 2-core machine it takes
# minutes, and it must not be what times out the rest of the suite.
pytestmark = [pytest.mark.kernel, pytest.mark.cluster, pytest.mark.harness]


def _quick(tmp_path: Path) -> dict:
    out = tmp_path / "quick.json"
    env = dict(os.environ)
    env.pop("NBREWIND_STORE", None)  # the harness gives every run its own store
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    report["returncode"] = proc.returncode
    report["stdout"] = proc.stdout
    return report


@pytest.mark.timeout(1560)
def test_quick_harness_repeat_outputs_equal_fresh_outputs(tmp_path: Path) -> None:
    report = _quick(tmp_path)
    assert report["failures"] == [], "\n".join(report["failures"])
    assert report["returncode"] == 0, report["stdout"][-3000:]
    summary = report["summary"]
    assert set(summary) == {"mapreduce", "dconv", "rag", "ctrend", "hep"}
    for name, s in summary.items():
        assert len(s["scenarios"]) >= 2, name
        # The unmodified repeat replays the cluster cell instead of starting a cluster.
        assert s["unmodified_decisions"][3] == "replayed", (name, s["unmodified_reasons"])
        assert s["unmodified_decisions"][0] == "replayed", (name, s["unmodified_reasons"])
        # Every notebook writes its input files: copying them once is the audit's floor, measured beside it.
        assert s["input_file_bytes"] > 0 and s["copy_floor_s"] > 0, (name, s.get("copy_floor_s"))
        assert s["audit_overhead_beyond_copy_pct"] == pytest.approx(s["audit_overhead_pct"] - s["copy_floor_pct"])
    stations = summary["ctrend"]["scenarios"]["add-10-stations"]
    assert stations["misses"] == 10 * 3 + 1  # the new stations' clean, anomalies, trend + the aggregation
    assert stations["hits"] == 10  # the old stations' trends, loaded (their upstream culled)
    # The replies of the cells that ran say what they brought back: the cluster, started again
    # by re-running its cell for the compute cell that needs it, and the values it reads.
    said = report["raw"]["ctrend"]["rounds"][0]["scenarios"]["add-10-stations"]["repeat"]["said"]
    ran = [info["brought_back"] for info in said if info["decision"] == "ran"]
    assert sum(back["rebuilt"] for back in ran) >= 1 and sum(back["loaded"] for back in ran) >= 1, said
    assert all(back["seconds"] > 0 for back in ran if back["rebuilt"] or back["loaded"])
    # A late parameter change recomputes no task at all.
    assert summary["ctrend"]["scenarios"]["threshold-0.3"]["misses"] == 0
