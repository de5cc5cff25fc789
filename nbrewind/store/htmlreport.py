"""`jupyter nbrewind report`: one self-contained HTML page about a store.

The page has no network access and no external assets: the plots are drawn with
matplotlib and inlined as SVG (glyphs as paths), the styles are inline. It shows a
cell timeline per session (replayed or ran, duration, time saved), each cell's task
hits and misses, the reasons cells ran, what the store holds (cell values, files,
outputs, task results; dedup) and the most common reasons an unchanged cell ran again.
``report_data`` gathers the numbers (JSON-able); ``render_html`` draws them.
"""

from __future__ import annotations

import html
import io
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from nbrewind.store.maintenance import du
from nbrewind.store.report import LogRow, cell_log, sessions, trust_of
from nbrewind.store.store import Store
from nbrewind.store.walk import records, walk

#: Sessions drawn on the timeline (the newest ones).
TIMELINE_SESSIONS = 8
COLORS = {"replayed": "#2a9d8f", "executed": "#e76f51", "error": "#9b2226", "saved": "#bde0d9"}


@dataclass
class SessionTimeline:
    """One kernel session's cells in order: what happened to each and what it cost."""

    session: str | None
    kernel: str | None
    started: float | None
    cells: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    saved: float = 0.0


@dataclass
class ReportData:
    """Everything the page shows, as plain data."""

    store: str
    generated: float
    trusted: bool
    trust_reason: str
    timelines: list[SessionTimeline]
    reasons: list[tuple[str, int]]
    rerun_causes: list[tuple[str, int]]
    composition: dict[str, int]
    """Stored bytes of what the store holds, by kind (each object counted once)."""
    stored_bytes: int
    logical_bytes: int
    referenced_bytes: int
    dedup_ratio: float
    objects: int


def _short_reason(reason: str | None) -> str:
    """A reason without the run numbers that make equal reasons differ."""
    return re.sub(r"\s*\(?cell run #\d+\)?", "", reason or "").strip() or "(none)"


def report_data(store: Store) -> ReportData:
    """Read the catalog and walk the objects once; unpickles nothing."""
    trusted, trust_reason = trust_of(store)
    all_rows = cell_log(store)
    by_session: dict[str | None, list[LogRow]] = {}
    for row in all_rows:
        by_session.setdefault(row.session, []).append(row)
    timelines = []
    for info in sessions(store):
        rows = by_session.get(info.session, [])
        line = SessionTimeline(info.session, info.kernel, info.started)
        for r in rows:
            line.cells.append({
                "run": r.id, "execution_count": r.execution_count, "decision": r.decision, "status": r.status,
                "duration": r.duration or 0.0, "saved": r.saved, "task_hits": r.task_hits,
                "task_misses": r.task_misses, "why": r.why, "code": (r.code.strip().splitlines() or [""])[0][:80],
            })
        line.seconds = sum(c["duration"] for c in line.cells)
        line.saved = sum(c["saved"] for c in line.cells)
        timelines.append(line)
    executed = [r for r in all_rows if r.decision == "executed"]
    on_repeat = [r for r in executed if r.kernel == "repeat"] or executed
    reasons = Counter(_short_reason(r.reason) for r in on_repeat).most_common(10)
    seen: set[str] = set()
    causes: Counter[str] = Counter()
    runs = {r.id: r for r in store.catalog.cell_runs()}
    for row in all_rows:
        digest = runs[row.id].code_digest if row.id in runs else None
        if row.decision == "executed" and row.kernel == "repeat" and digest in seen:
            causes[_short_reason(row.reason)] += 1
        if digest:
            seen.add(digest)
    usage = du(store)
    return ReportData(
        str(store.root), time.time(), trusted, trust_reason, timelines, reasons, causes.most_common(10),
        _composition(store), usage.stored_bytes, usage.logical_bytes, usage.referenced_bytes, usage.dedup_ratio,
        usage.objects,
    )


def _composition(store: Store) -> dict[str, int]:
    """Stored bytes reached from each kind of root; an object reached from several kinds
    counts for the first of: files, task results, cell values, outputs, other."""
    groups: dict[str, list[str]] = {"files": [], "task results": [], "cell values": [], "outputs": [], "other": []}
    for record in records(store.catalog, store.objects):
        if record.kind == "outputs":
            groups["outputs"].append(record.digest)
        elif record.kind in ("task", "ref"):
            groups["task results"].append(record.digest)
        elif record.kind in ("checkpoint", "rebuild") and (record.name or "").startswith("@file:"):
            groups["files"].append(record.digest)
        elif record.kind in ("checkpoint", "rebuild"):
            groups["cell values"].append(record.digest)
        else:
            groups["other"].append(record.digest)
    counted: set[str] = set()
    sizes: dict[str, int] = {}
    for kind, roots in groups.items():
        total = 0
        for digest in walk(store.objects, roots).reached - counted:
            try:
                total += store.objects.stored_size(digest)
            except Exception:  # removed or damaged meanwhile: verify reports those
                continue
            counted.add(digest)
        sizes[kind] = total
    return sizes


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inline


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=96)
    figure.set_layout_engine("constrained")
    return figure


def _plot_timeline(data: ReportData) -> str:
    shown = data.timelines[-TIMELINE_SESSIONS:]
    figure = _figure(9.5, 0.7 + 0.55 * max(1, len(shown)))
    axes = figure.add_subplot()
    longest = max((t.seconds + t.saved for t in shown), default=0.0) or 1.0
    for row, line in enumerate(shown):
        x = 0.0
        for cell in line.cells:
            width = max(cell["duration"], longest * 0.002)
            color = COLORS["error"] if cell["status"] == "error" else COLORS.get(cell["decision"] or "", "#999999")
            axes.barh(row, width, left=x, height=0.6, color=color, edgecolor="white", linewidth=0.5)
            x += width
        if line.saved:
            axes.barh(row, line.saved, left=x, height=0.6, color=COLORS["saved"], hatch="//", edgecolor="#2a9d8f", linewidth=0)
    labels = [f"{t.kernel or '?'} {time.strftime('%m-%d %H:%M', time.localtime(t.started)) if t.started else ''}" for t in shown]
    axes.set_yticks(range(len(shown)), labels)
    axes.invert_yaxis()
    axes.set_xlabel("seconds in cells (hatched: time saved against the recorded runs)")
    from matplotlib.patches import Patch

    axes.legend(handles=[Patch(color=COLORS["replayed"], label="replayed"), Patch(color=COLORS["executed"], label="ran"),
                         Patch(color=COLORS["error"], label="raised"), Patch(facecolor=COLORS["saved"], hatch="//", label="saved")],
                loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, frameon=False, ncols=4)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _plot_tasks(line: SessionTimeline) -> str:
    figure = _figure(9.5, 2.6)
    axes = figure.add_subplot()
    cells = list(range(1, len(line.cells) + 1))
    hits = [c["task_hits"] for c in line.cells]
    misses = [c["task_misses"] for c in line.cells]
    axes.bar(cells, hits, color=COLORS["replayed"], label="hit (loaded from the cache)")
    axes.bar(cells, misses, bottom=hits, color=COLORS["executed"], label="miss (computed)")
    axes.set_xlabel("cell run of the newest session, in order")
    axes.set_ylabel("Dask tasks")
    axes.set_xticks(cells)
    axes.legend(fontsize=8, frameon=False)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _plot_counts(pairs: list[tuple[str, int]], xlabel: str) -> str:
    figure = _figure(9.5, 0.6 + 0.32 * max(1, len(pairs)))
    axes = figure.add_subplot()
    labels = [label if len(label) <= 60 else label[:57] + "..." for label, _ in pairs]
    axes.barh(range(len(pairs)), [n for _, n in pairs], color=COLORS["executed"])
    axes.set_yticks(range(len(pairs)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel(xlabel)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _plot_composition(data: ReportData) -> str:
    figure = _figure(9.5, 2.2)
    axes = figure.add_subplot()
    kinds = [k for k, v in data.composition.items() if v] or list(data.composition)
    values = [data.composition[k] / 1e6 for k in kinds]
    axes.barh(kinds, values, color="#457b9d")
    for y, kind in enumerate(kinds):
        axes.text(values[y], y, f" {_bytes(data.composition[kind])}", va="center", fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("MB stored (each object counted once)")
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1000px;color:#222;padding:0 1rem}
h1{font-size:1.5rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.9rem} .cards{display:flex;gap:1rem;flex-wrap:wrap;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;min-width:9rem}
.card b{display:block;font-size:1.3rem} table{border-collapse:collapse;font-size:.85rem;width:100%}
td,th{border-bottom:1px solid #eee;padding:.25rem .5rem;text-align:left;vertical-align:top}
td.num,th.num{text-align:right} .replayed{color:#2a9d8f} .executed{color:#e76f51} .error{color:#9b2226}
svg{max-width:100%;height:auto} .empty{color:#777;font-style:italic} code{font-size:.8rem}
"""


def _bytes(value: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,} bytes"


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def render_html(data: ReportData, title: str | None = None) -> str:
    """The page for `data`: one string, nothing fetched when it is opened."""
    esc = html.escape
    newest = data.timelines[-1] if data.timelines else None
    total_saved = sum(t.saved for t in data.timelines)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title or 'NBRewind report')}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{esc(title or 'NBRewind report')}</h1>",
        f"<p class='meta'>store <code>{esc(data.store)}</code>; "
        f"{'trusted' if data.trusted else 'NOT trusted'} ({esc(data.trust_reason)}); "
        f"generated {esc(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(data.generated)))}</p>",
        "<div class='cards' id='summary'>",
        f"<div class='card'><b>{len(data.timelines)}</b>kernel sessions</div>",
        f"<div class='card'><b>{sum(len(t.cells) for t in data.timelines)}</b>cell runs</div>",
        f"<div class='card'><b>{_seconds(total_saved)}</b>time saved by replays and cached tasks</div>",
        f"<div class='card'><b>{data.stored_bytes / 1e6:,.1f} MB</b>stored ({data.objects:,} objects)</div>",
        f"<div class='card'><b>{data.dedup_ratio:.2f}&times;</b>dedup</div>",
        "</div>",
        "<section id='timeline'><h2>Cell timeline per session</h2>",
    ]
    if data.timelines:
        parts.append(_plot_timeline(data))
        parts.append("<table><tr><th>session</th><th>kernel</th><th class='num'>cells</th><th class='num'>replayed</th>"
                     "<th class='num'>ran</th><th class='num'>time in cells</th><th class='num'>saved</th></tr>")
        for t in reversed(data.timelines):
            replayed = sum(c["decision"] == "replayed" for c in t.cells)
            parts.append(f"<tr><td><code>{esc(str(t.session)[:12])}</code></td><td>{esc(t.kernel or '')}</td>"
                         f"<td class='num'>{len(t.cells)}</td><td class='num'>{replayed}</td>"
                         f"<td class='num'>{len(t.cells) - replayed}</td><td class='num'>{_seconds(t.seconds)}</td>"
                         f"<td class='num'>{_seconds(t.saved)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='empty'>no cell runs recorded yet</p>")
    parts.append("</section><section id='cells'><h2>The newest session, cell by cell</h2>")
    if newest is not None:
        parts.append("<table><tr><th class='num'>In</th><th>decision</th><th class='num'>time</th><th class='num'>saved</th>"
                     "<th class='num'>tasks hit/miss</th><th>why</th><th>code</th></tr>")
        for c in newest.cells:
            kind = "error" if c["status"] == "error" else (c["decision"] or "")
            parts.append(f"<tr><td class='num'>{c['execution_count'] if c['execution_count'] is not None else ''}</td>"
                         f"<td class='{esc(kind)}'>{esc(c['decision'] or '')}</td><td class='num'>{_seconds(c['duration'])}</td>"
                         f"<td class='num'>{_seconds(c['saved']) if c['saved'] else '-'}</td>"
                         f"<td class='num'>{c['task_hits']}/{c['task_misses']}</td><td>{esc(c['why'])}</td>"
                         f"<td><code>{esc(c['code'])}</code></td></tr>")
        parts.append("</table>")
    parts.append("</section><section id='tasks'><h2>Dask tasks per cell (newest session)</h2>")
    if newest is not None and any(c["task_hits"] or c["task_misses"] for c in newest.cells):
        parts.append(_plot_tasks(newest))
    else:
        parts.append("<p class='empty'>no Dask tasks in the newest session</p>")
    parts.append("</section><section id='reasons'><h2>Why cells ran</h2>")
    parts.append(_plot_counts(data.reasons, "cell runs") if data.reasons else "<p class='empty'>no cell ran</p>")
    parts.append("</section><section id='composition'><h2>What the store holds</h2>")
    parts.append(_plot_composition(data))
    parts.append(f"<p class='meta'>{data.stored_bytes:,} bytes on disk for {data.logical_bytes:,} logical bytes; "
                 f"the checkpoints reference {data.referenced_bytes:,} bytes, so deduplication saves "
                 f"{data.dedup_ratio:.2f}&times;.</p>")
    parts.append("</section><section id='rerun-causes'><h2>Unchanged cells that ran again: top causes</h2>")
    if data.rerun_causes:
        parts.append("<table><tr><th>cause</th><th class='num'>cell runs</th></tr>")
        parts += [f"<tr><td>{esc(reason)}</td><td class='num'>{n}</td></tr>" for reason, n in data.rerun_causes]
        parts.append("</table>")
    else:
        parts.append("<p class='empty'>none: every cell whose code was recorded before either replayed or was edited</p>")
    parts.append("</section></body></html>\n")
    return "".join(parts)


def report_json(data: ReportData) -> dict[str, Any]:
    """`data` as JSON-able dicts."""
    return asdict(data)
