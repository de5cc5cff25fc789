"""Issue 13, item 7: kill -9 an audit at random moments; nothing recorded is ever wrong.

Each run audits the in-place-edit notebook (numpy arrays and a DataFrame edited in
place right after being checkpointed) on a real audit kernel with a fresh store, and
SIGKILLs the kernel process after a random delay (seeded, logged), which lands in a
cell, between cells, in the writer's backlog or during the shutdown flush. Then:

- `jupyter nbrewind verify` passes on the store;
- a repeat of the notebook replays exactly the cells that were durable before the
  kill (a prefix), runs the rest, shows what a plain python3 kernel shows and prints
  no NBRewind notice;
- a re-audit on the same store records every cell and prints no NBRewind notice.

`NBREWIND_KILL_RUNS`, `NBREWIND_KILL_MB`, `NBREWIND_KILL_SEED` and `NBREWIND_KILL_LOG`
(a JSON-lines file of every run, then the totals) size and record the loop. The full
loop is marked slow (its own CI step, `.ci/kill-loop`); a three-run variant of a
smaller notebook runs in the default suite.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nbrewind.store import Store
from reliability_tools import Kernel, inplace_cells, nbrewind_lines

pytestmark = pytest.mark.kernel


def _verify(store: Path) -> bool:
    cli = [sys.executable, "-c", "from nbrewind.cli import main; raise SystemExit(main())"]
    done = subprocess.run([*cli, "verify", "--store", str(store)], capture_output=True, text=True, timeout=600)
    return done.returncode == 0


def _decisions(store: Path, session_index: int) -> list[str]:
    """Decisions of the `session_index`-th kernel session that recorded anything in the store."""
    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
    sessions = list(dict.fromkeys(r.session for r in runs))
    if session_index >= len(sessions):
        return []
    return [r.decision for r in runs if r.session == sessions[session_index]]


def _recorded(store: Path) -> int:
    if not (store / "catalog.sqlite").exists():
        return 0
    return len(_decisions(store, 0))


def _audit_killed_after(
    folder: Path, env: dict[str, str], cells: list[str], delay: float, *, in_shutdown: bool = False
) -> dict[str, Any]:
    """Audit `cells` (then shut down gracefully) while a timer SIGKILLs the kernel `delay` s
    after it is ready, or, `in_shutdown`, `delay` s after the shutdown request."""
    kernel = Kernel("nbrewind-audit", folder, env, folder / "audit.err", shutdown_wait=60).start()
    pid = kernel.pid
    killed = threading.Event()

    def kill() -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return  # it had already exited: this run was not killed
        killed.set()

    timer = threading.Timer(delay, kill)
    started = time.monotonic()
    if not in_shutdown:
        timer.start()
    done_cells = 0
    last_reply = None
    try:
        for code in cells:
            reply, _ = kernel.execute(code, timeout=120)
            assert reply["content"]["status"] == "ok", reply["content"]
            done_cells += 1
        last_reply = time.monotonic() - started
        if in_shutdown:
            timer.start()
        kernel.shutdown()
    except (TimeoutError, RuntimeError):
        assert killed.is_set(), "the audit failed without being killed"
    finally:
        exited = time.monotonic() - started
        timer.cancel()
        if timer.ident is not None:  # started
            timer.join()
        kernel.close()
    return {
        "killed": killed.is_set(),
        "replies": done_cells,
        "seconds": round(exited, 3),
        "last_reply_s": None if last_reply is None else round(last_reply, 3),
    }


def kill_loop(tmp_path: Path, kernel_env: dict[str, str], runs: int, mb: int, seed: int, log: Path | None) -> dict[str, Any]:
    cells = inplace_cells(mb)
    plain_env = {k: v for k, v in kernel_env.items() if k != "NBREWIND_STORE"}
    plain = Kernel("python3", tmp_path, plain_env, tmp_path / "plain.err").start()
    try:
        expected = plain.run(cells)
    finally:
        plain.close()

    # How long a whole audit takes here, from a ready kernel to the end of its shutdown:
    # the kills are spread over that span, and one run in four is killed during the
    # shutdown's flush (timed from the shutdown request).
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    timing = _audit_killed_after(calibration, dict(kernel_env, NBREWIND_STORE=str(calibration / "store")), cells, 1e6)
    span, flush_from = timing["seconds"], timing["last_reply_s"]

    rng = random.Random(seed)
    totals = {
        "runs": 0, "killed": 0, "killed_in_shutdown": 0, "corrupt": 0, "failing_reruns": 0,
        "seed": seed, "mb": mb, "span_s": span, "last_reply_s": flush_from,
    }
    records = []
    for index in range(runs):
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        store = folder / "store"
        env = dict(kernel_env, NBREWIND_STORE=str(store))
        in_shutdown = index % 4 == 3
        delay = round(rng.uniform(0.0, span - flush_from) if in_shutdown else rng.uniform(0.05, 1.0) * span, 3)
        record: dict[str, Any] = {"run": index, "delay_s": delay, "from": "shutdown request" if in_shutdown else "kernel ready"}
        record.update(_audit_killed_after(folder, env, cells, delay, in_shutdown=in_shutdown))
        record["durable_cells"] = durable = _recorded(store)
        record["verify_ok"] = _verify(store)

        repeat = Kernel("nbrewind-repeat", folder, env, folder / "repeat.err", shutdown_wait=60).start()
        try:
            shown = repeat.run(cells)
            repeat.shutdown()
        finally:
            repeat.close()
        repeat_decisions = _decisions(store, 1 if durable else 0)
        record["repeat_equal"] = shown == expected
        record["repeat_replayed_durable"] = repeat_decisions == ["replayed"] * durable + ["executed"] * (len(cells) - durable)
        record["repeat_notices"] = nbrewind_lines(repeat.stderr())

        audit = Kernel("nbrewind-audit", folder, env, folder / "reaudit.err", shutdown_wait=60).start()
        try:
            reaudited = audit.run(cells)
            audit.shutdown()
        finally:
            audit.close()
        record["reaudit_notices"] = nbrewind_lines(audit.stderr())
        record["reaudit_equal"] = reaudited == expected
        with Store.open(store, create=False) as opened:
            newest = opened.catalog.cell_runs()[-len(cells) :]
        record["reaudit_recorded_all"] = [r.code for r in newest] == cells and all(r.kernel == "audit" for r in newest)
        record["verify_after_ok"] = _verify(store)

        record["failing"] = failing = not (
            record["repeat_equal"]
            and record["repeat_replayed_durable"]
            and not record["repeat_notices"]
            and not record["reaudit_notices"]
            and record["reaudit_equal"]
            and record["reaudit_recorded_all"]
        )
        totals["runs"] += 1
        totals["killed"] += record["killed"]
        totals["killed_in_shutdown"] += record["killed"] and record["replies"] == len(cells)
        totals["corrupt"] += not (record["verify_ok"] and record["verify_after_ok"])
        totals["failing_reruns"] += failing
        records.append(record)
        if log is not None:
            with open(log, "a") as out:
                out.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    if log is not None:
        with open(log, "a") as out:
            out.write(json.dumps({"totals": totals}) + "\n")
    print(json.dumps({"totals": totals}), flush=True)
    return {"totals": totals, "records": records}


def _settings(runs: int, mb: int) -> tuple[int, int, int, Path | None]:
    log = os.environ.get("NBREWIND_KILL_LOG")
    return (
        int(os.environ.get("NBREWIND_KILL_RUNS", runs)),
        int(os.environ.get("NBREWIND_KILL_MB", mb)),
        int(os.environ.get("NBREWIND_KILL_SEED", 13)),
        Path(log) if log else None,
    )


def _check(result: dict[str, Any]) -> None:
    totals = result["totals"]
    bad = [r for r in result["records"] if not (r["verify_ok"] and r["verify_after_ok"])]
    assert totals["corrupt"] == 0, bad
    failing = [r for r in result["records"] if r["failing"]]
    assert totals["failing_reruns"] == 0, failing
    assert totals["killed"] >= max(1, (3 * totals["runs"]) // 4), totals  # the kills landed


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_kill_9_loop(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    """At least 20 runs of a 300 MB notebook (run it with `.ci/kill-loop`)."""
    runs, mb, seed, log = _settings(20, 300)
    _check(kill_loop(tmp_path, kernel_env, runs, mb, seed, log))


@pytest.mark.timeout(900)
def test_kill_9_loop_short(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    """Three runs of a 150 MB notebook, in the default suite."""
    _check(kill_loop(tmp_path, kernel_env, 3, 150, 7, None))
