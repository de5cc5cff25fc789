"""Automatic priority bumps, side by side on real `python3` and `nbrewind-audit` kernels.

Run: `python -m benchmarks.bench_priority [--runs N] [--json OUT] [--kernels python3,nbrewind-audit]
[--policy-kernel python3] [--saturation S]`.

Each kernel gets a `LocalCluster` of one worker with one thread (threads, in the
kernel's process) made by the notebook's own cells; every figure is measured
inside the kernel with `time.perf_counter` around the one statement a user waits
on, and every run uses fresh task arguments, so the audit kernel's task cache
never serves a result (it stores them, as on a first run).

The two rows of issue 19, and what the second costs the rest of the work:

- `result`: `futs[150].result()` right after `client.map` of 200 tasks of 20 ms;
- `slice`: `x[150].sum().compute()` on a persisted 200-block array of 20 ms blocks;
- `slice-then-all`: that slice, then `wait(x)` for all 200 blocks: the time until
  everything is done (the throughput check).

In the NBRewind kernels every run measures these rows twice, as shipped and with the
worker's thread holds for bumped chains switched off (the worker plugin's
`hold_timeout` set to 0: what the kernels did before holds existed), and reads how
long each hold lasted: the time from a link of the chain finishing on the worker to
the next link arriving from the scheduler, one round trip.

The gather policy, measured with automatic bumps on and then off
(`nbrewind.auto-priority`) in one kernel: the `python3` one, where the notebook
turns them on with `enable_auto_priority(client)`, so that the audit kernel's task
cache (which stores every result it computes) does not blur what the bumps cost
(`--policy-kernel` picks another):

- `gather-10`: `client.gather(futs[150:160])` after the same map: what a bump on
  gather buys;
- `all-after-gather`: the time until all 200 are done when the notebook first
  gathers those 10: what a bump on gather could cost the rest of the work;
- `whole-compute`: `x.sum().compute()` on a persisted 200-block array of 20 ms
  blocks: a wait for everything, which must be a no-op;
- `whole-compute-tiny`: the same with 500 blocks of no work, where a
  per-compute cost would show;
- `gather-done-2000`: `client.gather` of 2,000 finished futures.

Medians over runs are reported; `÷D` is the median over the task duration.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

DURATION = 0.02
TASKS = 200
TARGET = 150
REPLY_TIMEOUT = 600.0

SETUP = f"""
import json, time, uuid
import numpy as np
import dask, dask.array as da
from distributed import Client, LocalCluster, wait
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=':0')
client = Client(cluster)

def slow(i, salt):
    time.sleep({DURATION})
    return i

def slow_block(block, salt):
    time.sleep({DURATION})
    return block + 1

def quick_block(block, salt):
    return block + 1

def settle():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(w.state.tasks for w in cluster.workers.values()):
        time.sleep(0.01)

def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

def fresh():
    return uuid.uuid4().hex
"""

#: name -> cell code that prints one JSON number (seconds); it cleans up after itself.
SCENARIOS = {
    "result": f"""
        futs = client.map(slow, range({TASKS}), salt=fresh())
        seconds = timed(lambda: futs[{TARGET}].result())
        client.cancel(futs); del futs; settle()
    """,
    "slice": f"""
        x = da.zeros(({TASKS}, 1000), chunks=(1, 1000)).map_blocks(slow_block, fresh()).persist()
        seconds = timed(lambda: x[{TARGET}].sum().compute())
        client.cancel(x); del x; settle()
    """,
    "slice-then-all": f"""
        x = da.zeros(({TASKS}, 1000), chunks=(1, 1000)).map_blocks(slow_block, fresh()).persist()
        def slice_then_all():
            x[{TARGET}].sum().compute()
            wait(x)
        seconds = timed(slice_then_all)
        del x; settle()
    """,
    "gather-10": f"""
        futs = client.map(slow, range({TASKS}), salt=fresh())
        seconds = timed(lambda: client.gather(futs[150:160]))
        client.cancel(futs); del futs; settle()
    """,
    "all-after-gather": f"""
        futs = client.map(slow, range({TASKS}), salt=fresh())
        def gather_then_all():
            client.gather(futs[150:160])
            wait(futs)
        seconds = timed(gather_then_all)
        del futs; settle()
    """,
    "whole-compute": f"""
        x = da.zeros(({TASKS}, 1000), chunks=(1, 1000)).map_blocks(slow_block, fresh()).persist()
        seconds = timed(lambda: x.sum().compute())
        del x; settle()
    """,
    "whole-compute-tiny": """
        x = da.zeros((500, 100), chunks=(1, 100)).map_blocks(quick_block, fresh()).persist()
        seconds = timed(lambda: x.sum().compute())
        del x; settle()
    """,
    "gather-done-2000": """
        futs = client.map(quick_block, range(2000), salt=fresh())
        wait(futs)
        seconds = timed(lambda: client.gather(futs))
        del futs; settle()
    """,
}

#: What a patched wait costs the notebook's thread before it waits (seconds per call).
CLIENT_COSTS = """
import timeit
from nbrewind.tasks.priority import bump_waited, set_auto_priority
set_auto_priority(True)
done = client.map(quick_block, range(2000), salt=fresh())
wait(done)
pending = client.map(slow, range(20), salt=fresh())
costs = {
    "bump_waited, 2000 finished futures": timeit.timeit(lambda: bump_waited(done), number=20) / 20,
    "bump_waited, 1 pending future (sends a bump)": timeit.timeit(lambda: bump_waited(pending[-1:]), number=20) / 20,
    "bump_waited, all 20 pending futures (skipped)": timeit.timeit(lambda: bump_waited(pending), number=20) / 20,
}
client.cancel(pending); del done, pending; settle()
print(json.dumps(costs))
"""

SIDE_BY_SIDE = ("result", "slice")
THROUGHPUT = ("slice-then-all",)
#: Cell that sets the worker plugin's hold timeout (None: the plugin's default).
HOLDS = """
from nbrewind.tasks.priority import HOLD_TIMEOUT as _HOLD_TIMEOUT
for _w in cluster.workers.values():
    if 'nbrewind-priority' in _w.plugins:
        _w.plugins['nbrewind-priority'].hold_timeout = _HOLD_TIMEOUT if {timeout} is None else {timeout}
"""
POLICY = ("gather-10", "all-after-gather", "whole-compute", "whole-compute-tiny", "gather-done-2000")


class Kernel:
    """A kernel started through jupyter_client; runs cells and reads what they print."""

    def __init__(self, name: str, folder: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        env = dict(os.environ, NBREWIND_STORE=str(folder / f"{name}.nbrewind"))
        self.name = name
        self.km, self.kc = start_new_kernel(kernel_name=name, cwd=str(folder), env=env)
        self.cells = 0

    def run(self, code: str) -> str:
        """Run ``code`` and return its stdout; raise with the traceback if it failed."""
        self.cells += 1
        # A line of its own per cell: a repeat kernel must never replay a measurement.
        msg_id = self.kc.execute(f"{textwrap.dedent(code).strip()}\n_cell_number = {self.cells}\n")
        deadline = time.monotonic() + REPLY_TIMEOUT
        out: list[str] = []
        error = None
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name}: no reply within {REPLY_TIMEOUT} s") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                error = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error is not None:
            raise RuntimeError(f"{self.name}: cell failed:\n{code}\n{error}")
        return "".join(out)

    def json(self, code: str) -> Any:
        """Run ``code``, whose last printed line is JSON, and return it decoded."""
        return json.loads(self.run(code).strip().splitlines()[-1])

    def seconds(self, scenario: str) -> tuple[float, float]:
        """The wait's seconds, and the seconds the scheduler spent on automatic bumps meanwhile."""
        wait, scheduler, _, _ = self.measure(scenario)
        return wait, scheduler

    def measure(self, scenario: str) -> tuple[float, float, list[float], int]:
        """:meth:`seconds`, with the seconds each thread hold on the workers lasted
        meanwhile and how many of them ended at their timeout."""
        code = "\n".join([
            "_plugin = cluster.scheduler.plugins.get('nbrewind-priority')",
            "_before = _plugin.auto_seconds if _plugin else 0.0",
            "_wp = [w.plugins['nbrewind-priority'] for w in cluster.workers.values() if 'nbrewind-priority' in w.plugins]",
            "_hb = [(len(p.hold_seconds), p.holds_timed_out) for p in _wp]",
            textwrap.dedent(SCENARIOS[scenario]),
            "_plugin = cluster.scheduler.plugins.get('nbrewind-priority')",
            "_holds = [h for p, (n, _) in zip(_wp, _hb) for h in list(p.hold_seconds)[n:]]",
            "_timeouts = sum(p.holds_timed_out - t for p, (_, t) in zip(_wp, _hb))",
            "print(json.dumps([seconds, (_plugin.auto_seconds if _plugin else 0.0) - _before, _holds, _timeouts]))",
        ])
        wait, scheduler, holds, timeouts = self.json(code)
        return float(wait), float(scheduler), [float(h) for h in holds], int(timeouts)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def measure(runs: int, kernels: list[str], policy_kernel: str, saturation: float | None = None) -> dict[str, Any]:
    """Seconds per (kernel or kernel/auto-setting, scenario), one list of runs each.

    An empty ``policy_kernel`` skips the policy part; ``saturation`` sets
    ``distributed.scheduler.worker-saturation`` for the clusters (distributed's default otherwise).
    """
    results: dict[str, dict[str, list[float]]] = {}
    setup = SETUP
    if saturation is not None:
        setup = f"import dask\ndask.config.set({{'distributed.scheduler.worker-saturation': {saturation!r}}})\n{SETUP}"
    with tempfile.TemporaryDirectory(prefix="bench-priority-") as tmp:
        for name in dict.fromkeys([*kernels, *([policy_kernel] if policy_kernel else [])]):
            kernel = Kernel(name, Path(tmp))
            try:
                kernel.run(setup)
                policy = name == policy_kernel
                if policy:
                    kernel.run("from nbrewind.tasks.priority import enable_auto_priority, set_auto_priority")
                for _ in range(runs):
                    if name in kernels:
                        kernel.run("set_auto_priority(True)" if policy else "pass")
                        # In the NBRewind kernels: as shipped, then with holds off (what they did before).
                        for label, timeout in [(name, None), *([(f"{name} holds off", 0)] if name.startswith("nbrewind") else [])]:
                            kernel.run(HOLDS.format(timeout=timeout))
                            for scenario in (*SIDE_BY_SIDE, *THROUGHPUT):
                                wait, _, holds, timeouts = kernel.measure(scenario)
                                results.setdefault(label, {}).setdefault(scenario, []).append(wait)
                                if holds or timeouts:
                                    results.setdefault("holds", {}).setdefault(f"{name} {scenario} ms", []).extend(h * 1000 for h in holds)
                                    results["holds"].setdefault(f"{name} {scenario} timeouts", []).append(timeouts)
                        kernel.run(HOLDS.format(timeout=None))
                    if not policy:
                        continue
                    if not name.startswith("nbrewind"):
                        kernel.run("_auto = enable_auto_priority(client)\n_auto.__enter__()")
                    for setting in ("on", "off"):
                        kernel.run(f"set_auto_priority({setting == 'on'})")
                        label = f"{name} auto {setting}"
                        if setting == "on" and not name.startswith("nbrewind"):
                            # The same two rows with bumps on but without the audit kernel's task cache.
                            for scenario in SIDE_BY_SIDE:
                                results.setdefault(label, {}).setdefault(scenario, []).append(kernel.seconds(scenario)[0])
                        for scenario in POLICY:
                            wait, scheduler = kernel.seconds(scenario)
                            results.setdefault(label, {}).setdefault(scenario, []).append(wait)
                            results.setdefault(f"{label} scheduler", {}).setdefault(scenario, []).append(scheduler)
                    costs = kernel.json(CLIENT_COSTS)
                    for what, value in costs.items():
                        results.setdefault("client", {}).setdefault(what, []).append(value)
                    if not name.startswith("nbrewind"):
                        kernel.run("_auto.__exit__(None, None, None)")
                    kernel.run("set_auto_priority(True)")
            finally:
                kernel.close()
    return {
        "runs": runs,
        "saturation": saturation,
        "duration": DURATION,
        "seconds": results,
        "median": {k: {s: statistics.median(v) for s, v in per.items()} for k, per in results.items()},
    }


def format_tables(data: dict[str, Any]) -> str:
    """The side-by-side rows, the policy rows and the per-call costs as plain text."""
    median, duration = data["median"], data["duration"]
    kernels = [
        k for k in median if " auto " not in k and " holds off" not in k and k not in ("client", "holds") and SIDE_BY_SIDE[0] in median[k]
    ]
    saturation = data.get("saturation")
    lines = [
        f"{data['runs']} runs; medians in seconds; D = {duration * 1000:.0f} ms; "
        f"worker-saturation {'default' if saturation is None else saturation}",
        "",
    ]
    header = f"{'action':<16}" + "".join(f"{k:>18}{'÷D':>7}" for k in kernels)
    lines.append(header + (f"{'ratio':>8}" if len(kernels) == 2 else ""))
    for scenario in (*SIDE_BY_SIDE, *THROUGHPUT):
        if not all(scenario in median[k] for k in kernels):
            continue
        row = f"{scenario:<16}"
        for k in kernels:
            row += f"{median[k][scenario]:>18.3f}{median[k][scenario] / duration:>7.1f}"
        if len(kernels) == 2:
            row += f"{median[kernels[0]][scenario] / median[kernels[1]][scenario]:>8.1f}"
        lines.append(row)
    for k in kernels:
        off = f"{k} holds off"
        if off not in median:
            continue
        lines += ["", f"{k}: holds on vs off{'':<6}{'on':>10}{'÷D':>7}{'off':>10}{'÷D':>7}{'on/off':>8}"]
        for scenario in (*SIDE_BY_SIDE, *THROUGHPUT):
            on_s, off_s = median[k][scenario], median[off][scenario]
            lines.append(
                f"{scenario:<32}{on_s:>10.3f}{on_s / duration:>7.1f}{off_s:>10.3f}{off_s / duration:>7.1f}{on_s / off_s:>8.2f}"
            )
    if "holds" in median:
        lines += ["", "thread holds (link finished on the worker -> next link arrived), per scenario:"]
        holds = data["seconds"]["holds"]
        for what, values in holds.items():
            if what.endswith(" ms"):
                base = what[: -len(" ms")]
                ordered = sorted(values)
                p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
                lines.append(
                    f"  {base}: {len(values)} holds, median {statistics.median(values):.1f} ms, 90th pct {p90:.1f} ms, "
                    f"max {max(values):.1f} ms, timeouts {sum(holds.get(base + ' timeouts', []))}"
                )
    for label_on in [k for k in median if k.endswith(" auto on")]:
        label_off = label_on.replace(" auto on", " auto off")
        scheduler = median[f"{label_on} scheduler"]
        name = label_on.split(" auto")[0]
        lines += ["", f"{'policy (' + name + ')':<22}{'auto on':>10}{'auto off':>10}{'on/off':>8}{'scheduler ms':>14}"]
        for scenario in POLICY:
            on, off = median[label_on][scenario], median[label_off][scenario]
            lines.append(f"{scenario:<22}{on:>10.4f}{off:>10.4f}{on / off:>8.2f}{scheduler[scenario] * 1000:>14.3f}")
    for label_on in [k for k in median if k.endswith(" auto on") and SIDE_BY_SIDE[0] in median[k]]:
        lines += ["", f"{label_on} (enable_auto_priority in the notebook):"]
        lines += [f"  {s}: {median[label_on][s]:.3f} s, {median[label_on][s] / duration:.1f} D" for s in SIDE_BY_SIDE]
    if "client" in median:
        lines += ["", "per call, in the notebook's thread:"]
        lines += [f"  {what}: {seconds * 1e6:.1f} µs" for what, seconds in median["client"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run every scenario on every kernel, print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--kernels", default="python3,nbrewind-audit", help="comma-separated kernel names")
    parser.add_argument(
        "--policy-kernel", default="python3", help="the kernel the gather policy is measured in ('' skips it)"
    )
    parser.add_argument("--saturation", type=float, help="distributed.scheduler.worker-saturation (default: distributed's)")
    args = parser.parse_args(argv)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    data = measure(args.runs, kernels, args.policy_kernel, args.saturation)
    print(format_tables(data))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
