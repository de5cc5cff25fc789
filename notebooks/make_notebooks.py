"""Write the five domain notebooks of the benchmark suite (MapReduce, DConv, RAG-lite, CTrend, HEP).

Run `python notebooks/make_notebooks.py` after editing a cell below; the .ipynb files
are rebuilt byte for byte (fixed cell ids, no outputs, no execution counts), so a diff
of a notebook shows only what changed here.

Every notebook follows the same shape:

1. parameters: `SCALE` (1.0 = a 10-40 s run on 2 cores; raise it on a real cluster),
   sizes derived from it, and the data folder (relative to the notebook's folder);
2. imports and the notebook's functions (the "early" functions edit scenarios change);
3. generation of its synthetic input files, every file from its own fixed seed, so
   the same parameters always write the same bytes;
4. a `distributed.LocalCluster` of 2 single-threaded workers and its `Client`;
5. the Dask work, one or more cells;
6. summaries printed (and, in HEP and CTrend, a plot);
7. closing the client and the cluster.

The edit scenarios that the harness applies to these notebooks live in
`benchmarks/scenarios.py`; they replace exact snippets of the cells below, so keep
those snippets in sync.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}

CLUSTER_CELL = """\
from distributed import Client, LocalCluster

cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
client = Client(cluster)
print(f"{len(cluster.workers)} workers")"""

CLOSE_CELL = """\
client.close()
cluster.close()"""

MAPREDUCE = [
    """\
# MapReduce: per-file statistics over CSV files, a pairwise combine and a final reduce.
SCALE = 1.0
N_FILES = max(8, round(20 * SCALE))
ROWS_PER_FILE = max(2_000, round(200_000 * SCALE))
DATA = "mapreduce-data\"""",
    """\
import os

import dask
import numpy as np
import pandas as pd

CATEGORIES = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])


def make_file(path: str, seed: int, rows: int) -> None:
    \"\"\"One CSV of synthetic events: a timestamp, a category, a user and two measures.\"\"\"
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "time": 1_704_067_200 + np.sort(rng.integers(0, 365 * 86_400, rows)),
            "category": CATEGORIES[rng.integers(0, len(CATEGORIES), rows)],
            "user": rng.integers(0, 5_000, rows),
            "value": np.round(rng.normal(10.0, 4.0, rows), 4),
            "weight": np.round(rng.exponential(1.0, rows), 4),
        }
    )
    frame.to_csv(path, index=False)


def file_stats(path: str) -> dict:
    \"\"\"Map: counts, sums, min/max and per-category and per-month counts of one file.\"\"\"
    df = pd.read_csv(path)
    df["time"] = pd.to_datetime(df["time"], unit="s")
    v = df["value"]
    by_cat = df.groupby("category").agg(n=("value", "size"), total=("value", "sum"), wsum=("weight", "sum"))
    by_month = df.groupby(df["time"].dt.month).size()
    users = df.groupby("user")["value"].sum()
    for q in (0.1, 0.5, 0.9):  # per user and month quantiles: the heavy part of the map
        users = users.add(df.groupby(["user", df["time"].dt.month])["value"].quantile(q).groupby(level=0).mean(), fill_value=0)
    return {
        "n": len(df),
        "sum": float(v.sum()),
        "sumsq": float((v * v).sum()),
        "min": float(v.min()),
        "max": float(v.max()),
        "by_cat": by_cat,
        "by_month": by_month,
        "users": users,
    }


def combine(a: dict, b: dict) -> dict:
    \"\"\"Combine two partial statistics.\"\"\"
    return {
        "n": a["n"] + b["n"],
        "sum": a["sum"] + b["sum"],
        "sumsq": a["sumsq"] + b["sumsq"],
        "min": min(a["min"], b["min"]),
        "max": max(a["max"], b["max"]),
        "by_cat": a["by_cat"].add(b["by_cat"], fill_value=0),
        "by_month": a["by_month"].add(b["by_month"], fill_value=0),
        "users": a["users"].add(b["users"], fill_value=0),
    }


def tree_reduce(parts: list) -> object:
    \"\"\"Pairwise combine, level by level, down to one delayed value.\"\"\"
    level = list(parts)
    while len(level) > 1:
        pairs = [dask.delayed(combine)(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]""",
    """\
os.makedirs(DATA, exist_ok=True)
paths = [f"{DATA}/events-{i:03d}.csv" for i in range(N_FILES)]
for i, path in enumerate(paths):
    make_file(path, seed=1000 + i, rows=ROWS_PER_FILE)
print(f"{len(paths)} files, {sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB")""",
    CLUSTER_CELL,
    """\
partials = [dask.delayed(file_stats)(path) for path in paths]
(total,) = dask.compute(tree_reduce(partials))
mean = total["sum"] / total["n"]
std = (total["sumsq"] / total["n"] - mean**2) ** 0.5
print(f"rows {total['n']:,}  mean {mean:.6f}  std {std:.6f}  min {total['min']}  max {total['max']}")""",
    """\
TOP = 5
summary = total["by_cat"].assign(mean=lambda t: t["total"] / t["n"]).sort_values("n", ascending=False)
print(summary.head(TOP).round(4).to_string())
print(total["by_month"].astype(int).to_string())
top_users = total["users"].nlargest(TOP)
print(top_users.round(4).to_string())""",
    CLOSE_CELL,
]

DCONV = [
    """\
# DConv: tile a large synthetic image, convolve every tile as a Dask task, stitch, save.
SCALE = 1.0
TILE = 512
BANDS = max(2, round(6 * SCALE))  # rows of tiles
WIDTH_TILES = max(2, round(6 * SCALE))
PASSES = 24  # the 3x3 filter is applied this many times; the halo is as wide
DATA = "dconv-data\"""",
    """\
import os

import dask
import numpy as np

FILTERS = {
    "sharpen": np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype=np.float32) / 1.0,
    "blur": np.full((3, 3), 1 / 9, dtype=np.float32),
    "sobel": np.array([[1, 0, -1], [2, 0, -2], [1, 0, -1]], dtype=np.float32) / 4.0,
}
FILTER = "blur"  # sharpen amplifies noise 5x a pass: 24 passes overflow float32


def make_band(seed: int, rows: int, cols: int) -> np.ndarray:
    \"\"\"One horizontal band of a synthetic image: smooth blobs plus noise, from its own seed.\"\"\"
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float32)
    band = np.zeros((rows, cols), dtype=np.float32)
    for _ in range(24):
        cy, cx, r = rng.uniform(0, rows), rng.uniform(0, cols), rng.uniform(10, 80)
        band += np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r)).astype(np.float32)
    band += rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    return band


def convolve3x3(tile: np.ndarray, weights: np.ndarray, passes: int) -> np.ndarray:
    \"\"\"Apply a 3x3 filter `passes` times (valid mode: each pass trims one pixel per side).\"\"\"
    out = tile
    for _ in range(passes):
        h, w = out.shape
        acc = np.zeros((h - 2, w - 2), dtype=np.float32)
        for dy in range(3):
            for dx in range(3):
                acc += weights[dy, dx] * out[dy : dy + h - 2, dx : dx + w - 2]
        out = acc
    return out


def convolve_tile(band_files: list, offset: int, col: int, tile: int, weights: np.ndarray, passes: int) -> np.ndarray:
    \"\"\"Convolve one tile, read with a halo of `passes` pixels from its band's file and its neighbours'.

    `band_files` are the tile's band and the bands above and below it that exist; the
    tile's band is `band_files[offset]`. At the image border edge pixels are repeated.
    \"\"\"
    padded = np.pad(np.concatenate([np.load(f) for f in band_files]), passes, mode="edge")
    region = padded[offset * tile : offset * tile + tile + 2 * passes, col * tile : (col + 1) * tile + 2 * passes]
    return convolve3x3(region, weights, passes)""",
    """\
os.makedirs(DATA, exist_ok=True)
band_files = [f"{DATA}/band-{b:03d}.npy" for b in range(BANDS)]
for b, name in enumerate(band_files):
    np.save(name, make_band(7000 + b, TILE, TILE * WIDTH_TILES))
print(f"image {BANDS * TILE} x {WIDTH_TILES * TILE}")""",
    CLUSTER_CELL,
    """\
weights = FILTERS[FILTER]
tiles = {
    (r, c): dask.delayed(convolve_tile)(band_files[max(r - 1, 0) : r + 2], min(r, 1), c, TILE, weights, PASSES)
    for r in range(BANDS)
    for c in range(WIDTH_TILES)
}
done = dict(zip(tiles, dask.compute(*tiles.values())))
result = np.block([[done[(r, c)] for c in range(WIDTH_TILES)] for r in range(BANDS)])
print(result.shape, f"{float(result.mean()):.6f}", f"{float(result.std()):.6f}")""",
    """\
CLIP_PERCENTILE = 99.5
lo, hi = np.percentile(result, [100 - CLIP_PERCENTILE, CLIP_PERCENTILE])
scaled = np.clip((result - lo) / (hi - lo), 0, 1)
out8 = (scaled * 255).astype(np.uint8)
np.save(f"{DATA}/convolved.npy", out8)
print(f"clip [{lo:.4f}, {hi:.4f}]  histogram {np.bincount(out8.ravel() // 32, minlength=8).tolist()}")""",
    CLOSE_CELL,
]

RAG = [
    """\
# RAG-lite: chunk a synthetic corpus book by book, build a BM25 index, retrieve, build prompts.
SCALE = 1.0
N_BOOKS = max(4, round(24 * SCALE))
WORDS_PER_BOOK = max(2_000, round(150_000 * SCALE))
CHUNK, OVERLAP = 200, 50
DATA = "rag-data\"""",
    """\
import math
import os
import re
from collections import Counter

import dask
import numpy as np

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "en", "ar", "is", "ul", "om", "de", "ph", "qu"]


def make_vocabulary(size: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES, rng.integers(1, 4))))
    return sorted(words)


def make_book(path: str, vocab: list, seed: int, words: int) -> None:
    \"\"\"A book of Zipf-distributed words in sentences and paragraphs, from its own seed.\"\"\"
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.3, words), len(vocab)) - 1
    topic = rng.permutation(len(vocab))  # each book favours different words
    tokens = [vocab[topic[r]] for r in ranks]
    lines = [" ".join(tokens[i : i + 12]).capitalize() + "." for i in range(0, len(tokens), 12)]
    with open(path, "w") as f:
        f.write("\\n".join(lines))


def tokenize(text: str) -> list:
    return re.findall(r"[a-z]+", text.lower())


def chunk_book(path: str, size: int, overlap: int) -> list:
    \"\"\"Overlapping chunks of one book, each with its term counts.\"\"\"
    with open(path) as f:
        tokens = tokenize(f.read())
    name = os.path.basename(path)
    step = size - overlap
    chunks = []
    for start in range(0, max(1, len(tokens) - overlap), step):
        words = tokens[start : start + size]
        chunks.append({"id": f"{name}:{start}", "text": " ".join(words), "tf": Counter(words), "len": len(words)})
    return chunks


def book_stats(chunks: list) -> dict:
    \"\"\"Document frequencies, chunk count and total length of one book's chunks.\"\"\"
    df = Counter()
    for chunk in chunks:
        df.update(chunk["tf"].keys())
    return {"df": df, "n": len(chunks), "length": sum(c["len"] for c in chunks)}


def build_index(*books: dict) -> dict:
    \"\"\"Corpus statistics BM25 needs: document frequencies, number of chunks, mean chunk length.\"\"\"
    df = Counter()
    for book in books:
        df.update(book["df"])
    n = sum(book["n"] for book in books)
    return {"df": dict(df), "n_chunks": n, "avgdl": sum(book["length"] for book in books) / n}


def score_book(chunks: list, index: dict, queries: list, k: int, k1: float = 1.2, b: float = 0.75) -> list:
    \"\"\"BM25 scores of one book's chunks for every query; the book's top k per query.\"\"\"
    df, n_chunks, avgdl = index["df"], index["n_chunks"], index["avgdl"]
    out = []
    for q in queries:
        terms = tokenize(q)
        idf = {t: math.log(1 + (n_chunks - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in terms}
        scored = []
        for chunk in chunks:
            tf, dl = chunk["tf"], chunk["len"]
            s = sum(idf[t] * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * dl / avgdl)) for t in terms if t in tf)
            scored.append((round(s, 9), chunk["id"], chunk["text"]))
        scored.sort(key=lambda item: (-item[0], item[1]))
        out.append(scored[:k])
    return out""",
    """\
os.makedirs(DATA, exist_ok=True)
vocab = make_vocabulary(3_000, seed=11)
books = [f"{DATA}/book-{i:03d}.txt" for i in range(N_BOOKS)]
for i, book in enumerate(books):
    make_book(book, vocab, seed=500 + i, words=WORDS_PER_BOOK)
print(f"{len(books)} books, {sum(os.path.getsize(p) for p in books) / 1e6:.1f} MB")""",
    CLUSTER_CELL,
    """\
chunked = [dask.delayed(chunk_book)(path, CHUNK, OVERLAP) for path in books]
index = dask.delayed(build_index)(*[dask.delayed(book_stats)(c) for c in chunked])""",
    """\
K = 3
rng = np.random.default_rng(99)
queries = [" ".join(rng.choice(vocab[:400], 3)) for _ in range(200)]
per_book = [dask.delayed(score_book)(c, index, queries, K) for c in chunked]
stats, per_book = dask.compute(index, per_book)
print(f"{stats['n_chunks']} chunks, {len(stats['df'])} terms, avgdl {stats['avgdl']:.2f}")
hits = [sorted((h for book in per_book for h in book[qi]), key=lambda item: (-item[0], item[1]))[:K] for qi in range(len(queries))]
print(hits[0][0][:2], hits[-1][0][:2])""",
    """\
MAX_CONTEXT = 600
prompts = []
for q, found in zip(queries, hits):
    context = "\\n".join(f"[{cid}] {text[:MAX_CONTEXT // len(found)]}" for _, cid, text in found)
    prompts.append(f"Answer the question using the context.\\nContext:\\n{context}\\nQuestion: {q}?")
print(len(prompts), sum(len(p) for p in prompts))
print(prompts[0][:300])""",
    CLOSE_CELL,
]

CTREND = [
    """\
# CTrend: per-station cleaning, monthly anomalies against a baseline, annual trends; then aggregate.
SCALE = 1.0
N_STATIONS = max(10, round(100 * SCALE))
YEARS = (1971, 2020)
BASELINE = (1981, 2010)
DATA = "ctrend-data\"""",
    """\
import os

import dask
import numpy as np
import pandas as pd


def make_station(path: str, station: int, years: tuple) -> None:
    \"\"\"Daily temperatures of one station: seasonal cycle, warming trend, noise, gaps, spikes.\"\"\"
    rng = np.random.default_rng(20_000 + station)
    days = pd.date_range(f"{years[0]}-01-01", f"{years[1]}-12-31", freq="D")
    t = np.arange(len(days)) / 365.25
    base = rng.uniform(-5, 25)
    trend = rng.normal(0.025, 0.01)
    temp = base + 10 * np.sin(2 * np.pi * (t - 0.3)) + trend * t + rng.normal(0, 3, len(days))
    temp[rng.random(len(days)) < 0.02] = np.nan  # gaps
    spikes = rng.random(len(days)) < 0.002
    temp[spikes] += rng.choice([-60, 60], spikes.sum())  # sensor errors
    ymd = days.year * 10_000 + days.month * 100 + days.day
    pd.DataFrame({"date": ymd, "tavg": np.round(temp, 2)}).to_csv(path, index=False)


def clean(path: str) -> pd.DataFrame:
    \"\"\"Parse one station file, drop physically impossible values and fill short gaps.\"\"\"
    df = pd.read_csv(path)
    df.index = pd.to_datetime(df["date"].astype(str), format="%Y%m%d")
    tavg = df["tavg"].where(df["tavg"].between(-45, 50))
    median = tavg.rolling(31, center=True, min_periods=5).median()
    spread = (tavg - median).abs().rolling(31, center=True, min_periods=5).median()
    tavg = tavg.where((tavg - median).abs() <= 6 * spread.clip(lower=0.5))  # despike against a running median
    return tavg.interpolate(limit=3).to_frame("tavg")


def monthly_anomalies(daily: pd.DataFrame, baseline: tuple) -> pd.Series:
    \"\"\"Monthly means minus the baseline period's mean for the same calendar month.\"\"\"
    monthly = daily["tavg"].resample("MS").mean()
    in_base = monthly[(monthly.index.year >= baseline[0]) & (monthly.index.year <= baseline[1])]
    climatology = in_base.groupby(in_base.index.month).mean()
    return monthly - climatology.reindex(monthly.index.month).to_numpy()


def annual_trend(anomalies: pd.Series) -> dict:
    \"\"\"Least-squares trend of annual mean anomalies, in degrees per decade.\"\"\"
    annual = anomalies.groupby(anomalies.index.year).mean().dropna()
    x, y = annual.index.to_numpy(float), annual.to_numpy()
    slope = np.polyfit(x, y, 1)[0]
    rng = np.random.default_rng(len(y))  # a fixed bootstrap per station length
    boot = [np.polyfit(x[i], y[i], 1)[0] for i in rng.integers(0, len(y), (300, len(y)))]
    low, high = np.percentile(boot, [2.5, 97.5])
    return {
        "per_decade": round(float(slope) * 10, 9),
        "low": round(float(low) * 10, 9),
        "high": round(float(high) * 10, 9),
        "last_year": round(float(annual.iloc[-1]), 9),
        "years": int(len(annual)),
    }


def aggregate(names: list, *trends: dict) -> pd.DataFrame:
    return pd.DataFrame(list(trends), index=names)""",
    """\
os.makedirs(DATA, exist_ok=True)
stations = [f"{DATA}/station-{i:03d}.csv" for i in range(N_STATIONS)]
for i, path in enumerate(stations):
    make_station(path, i, YEARS)
print(f"{len(stations)} stations, {sum(os.path.getsize(p) for p in stations) / 1e6:.1f} MB")""",
    CLUSTER_CELL,
    """\
trends = []
for path in stations:
    daily = dask.delayed(clean)(path)
    anomalies = dask.delayed(monthly_anomalies)(daily, BASELINE)
    trends.append(dask.delayed(annual_trend)(anomalies))
names = [os.path.basename(p).removesuffix(".csv") for p in stations]
(table,) = dask.compute(dask.delayed(aggregate)(names, *trends))
print(table.describe().round(6).to_string())""",
    """\
WARMING = 0.2  # degrees per decade
warming = table[table["per_decade"] > WARMING]
print(f"{len(warming)} of {len(table)} stations warm faster than {WARMING} C/decade")
print(warming.sort_values("per_decade", ascending=False).head(5).round(6).to_string())""",
    """\
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3))
ax.hist(table["per_decade"], bins=20, color="tab:red")
ax.axvline(WARMING, color="k", linestyle="--")
ax.set_xlabel("trend, C per decade")
ax.set_ylabel("stations")
fig.tight_layout()
fig.savefig(f"{DATA}/trends.png", dpi=80)
plt.close(fig)
print(f"saved {DATA}/trends.png")""",
    CLOSE_CELL,
]

HEP = [
    """\
# HEP: synthetic collision events, per-file selection cuts, dijet mass histograms, merge, plot.
SCALE = 1.0
FILES_PER_DATASET = {"data": max(2, round(8 * SCALE)), "ttbar": max(2, round(6 * SCALE)), "zprime": max(1, round(4 * SCALE))}
EVENTS_PER_FILE = max(5_000, round(350_000 * SCALE))
DATA = "hep-data\"""",
    """\
import os

import dask
import numpy as np

BINS = np.linspace(0, 2000, 101)
SIGNAL_MASS = {"data": 1000.0, "ttbar": None, "zprime": 1000.0}


def make_file(path: str, seed: int, events: int, signal_mass: float | None) -> None:
    \"\"\"Jets of `events` collisions (pt, eta, phi, mass; flat arrays plus per-event counts).\"\"\"
    rng = np.random.default_rng(seed)
    njets = rng.poisson(3.0, events)
    n = int(njets.sum())
    pt = rng.exponential(60.0, n) + 20.0
    eta = rng.normal(0, 1.6, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    mass = rng.exponential(8.0, n)
    if signal_mass is not None:  # a resonance decaying to two back-to-back jets in 5% of events
        starts = np.concatenate([[0], np.cumsum(njets)[:-1]])
        chosen = starts[(njets >= 2) & (rng.random(events) < 0.05)]
        pt[chosen] = pt[chosen + 1] = signal_mass / 2 * rng.normal(1, 0.05, len(chosen))
        eta[chosen] = eta[chosen + 1] = 0.0
        phi[chosen + 1] = phi[chosen] - np.pi
    np.savez(path, njets=njets, pt=pt, eta=eta, phi=phi, mass=mass)


def select(pt: np.ndarray, eta: np.ndarray) -> np.ndarray:
    \"\"\"Jet-level cuts.\"\"\"
    return (pt > 30.0) & (np.abs(eta) < 2.5)


def dijet_histogram(path: str, bins: np.ndarray) -> np.ndarray:
    \"\"\"Invariant mass of the two leading selected jets of each event with two or more, histogrammed.\"\"\"
    f = np.load(path)
    njets, pt, eta, phi, mass = f["njets"], f["pt"], f["eta"], f["phi"], f["mass"]
    event = np.repeat(np.arange(len(njets)), njets)
    keep = select(pt, eta)
    event, pt, eta, phi, mass = event[keep], pt[keep], eta[keep], phi[keep], mass[keep]
    order = np.lexsort((-pt, event))
    event, pt, eta, phi, mass = event[order], pt[order], eta[order], phi[order], mass[order]
    first = np.flatnonzero(np.r_[True, event[1:] != event[:-1]])
    counts = np.diff(np.r_[first, len(event)])
    lead = first[counts >= 2]
    j1, j2 = lead, lead + 1
    px = pt[j1] * np.cos(phi[j1]) + pt[j2] * np.cos(phi[j2])
    py = pt[j1] * np.sin(phi[j1]) + pt[j2] * np.sin(phi[j2])
    pz = pt[j1] * np.sinh(eta[j1]) + pt[j2] * np.sinh(eta[j2])
    e = sum(np.sqrt(mass[j] ** 2 + (pt[j] * np.cosh(eta[j])) ** 2) for j in (j1, j2))
    mjj = np.sqrt(np.maximum(e**2 - px**2 - py**2 - pz**2, 0))
    return np.histogram(mjj, bins)[0]


def merge(*hists: np.ndarray) -> np.ndarray:
    return np.sum(hists, axis=0)""",
    """\
os.makedirs(DATA, exist_ok=True)
files = {}
for d, (dataset, count) in enumerate(FILES_PER_DATASET.items()):
    files[dataset] = [f"{DATA}/{dataset}-{i:03d}.npz" for i in range(count)]
    for i, path in enumerate(files[dataset]):
        make_file(path, seed=100 * d + i, events=EVENTS_PER_FILE, signal_mass=SIGNAL_MASS[dataset])
print({k: len(v) for k, v in files.items()})""",
    CLUSTER_CELL,
    """\
per_dataset = {ds: dask.delayed(merge)(*[dask.delayed(dijet_histogram)(p, BINS) for p in paths]) for ds, paths in files.items()}
(hists,) = dask.compute(per_dataset)
for ds, h in hists.items():
    print(f"{ds:>7}: {int(h.sum()):>9,} dijet events, peak bin {BINS[int(np.argmax(h))]:.0f} GeV")""",
    """\
WINDOW = (900.0, 1100.0)
centers = (BINS[:-1] + BINS[1:]) / 2
in_window = (centers >= WINDOW[0]) & (centers < WINDOW[1])
s, b = int(hists["zprime"][in_window].sum()), int(hists["ttbar"][in_window].sum())
print(f"window {WINDOW}: signal {s}, background {b}, s/sqrt(b) {s / max(b, 1) ** 0.5:.4f}")""",
    """\
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3))
for ds, h in hists.items():
    ax.step(centers, h, where="mid", label=ds)
ax.axvspan(*WINDOW, color="0.9")
ax.set_yscale("log")
ax.set_xlabel("m_jj, GeV")
ax.legend()
fig.tight_layout()
fig.savefig(f"{DATA}/mjj.png", dpi=80)
plt.close(fig)
print(f"saved {DATA}/mjj.png")""",
    CLOSE_CELL,
]

NOTEBOOKS: dict[str, list[str]] = {
    "mapreduce": MAPREDUCE,
    "dconv": DCONV,
    "rag": RAG,
    "ctrend": CTREND,
    "hep": HEP,
}


def build(name: str, cells: list[str]) -> object:
    """An nbformat v4 notebook with fixed cell ids, so regenerating it changes nothing."""
    import nbformat.v4 as v4

    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [v4.new_code_cell(source, id=f"{name}-{i:02d}") for i, source in enumerate(cells)]
    return nb


def write_all(folder: Path = HERE) -> list[Path]:
    """Write every notebook into `folder`; return their paths."""
    import nbformat

    written = []
    for name, cells in NOTEBOOKS.items():
        path = folder / f"{name}.ipynb"
        nbformat.write(build(name, cells), str(path))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
