#!/usr/bin/env python3
"""Plot gin-bench results: reads the JSON reports that `gin-bench OP --json FILE`
writes and draws one PNG per OP (several reports of one OP, e.g. 2 and 4 ranks,
share its axes).

    python3 bench/plot.py -o docs/ allreduce.json sendrecv.json moe.json ...

  allreduce  time and busBw vs size, gin next to NCCL
  sendrecv   latency and bandwidth vs size, gin next to NCCL
  moe        dispatch / combine time and GB/s per mode, gin next to NCCL
  put-bw     bandwidth vs size per coop, next to the copy engine (memcpy emulated)
  barrier, signal-lat, msg-rate   bar charts of their tables

Reports from CPU emulation are titled as such: they are CPU numbers, not GPU
figures. Needs python3 and matplotlib (not a CI dependency: plotting is done
by hand, see docs/performance.md).
"""
import argparse
import json
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py needs matplotlib (e.g. apt-get install python3-matplotlib or pip install matplotlib)")


def size_label(b):
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return f"{int(b)}"


def device_of(rep):
    """'NVIDIA H200, 132 SMs' from the per-rank descriptions."""
    devs = rep.get("rank_devices") or ["?"]
    d = re.sub(r"^GPU \d+ \(", "", devs[0]).rstrip(")")
    return re.sub(r", pid \d+$", "", d)


def title_of(op, reps):
    """'2 x NVIDIA H200, ...', or '1, 2 and 4 x ...' when the reports' rank counts differ."""
    r = reps[0]
    counts = sorted({int(x.get("ranks", len(x.get("rank_devices") or [1]))) for x in reps})
    n = str(counts[0]) if len(counts) == 1 else ", ".join(map(str, counts[:-1])) + f" and {counts[-1]}"
    t = f"gin-bench {op}: {n} x {device_of(r)}, transport {r.get('transport', '?')}"
    if any(x.get("mode") != "gpu" for x in reps):
        t += "\nCPU EMULATION: CPU numbers, not GPU figures"
    return t


def save(fig, title, out):
    """Title the figure, write it to `out` and free it."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def tag(rep, many):
    """Series suffix when several reports share one plot."""
    return f" ({rep.get('ranks')} ranks, {rep.get('transport')})" if many else ""


def size_axis(ax, xs):
    ax.set_xscale("log", base=2)
    ticks = xs[:: max(1, len(xs) // 10)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(x) for x in ticks], rotation=45)
    ax.set_xlabel("bytes")
    ax.grid(True, which="both", alpha=0.3)


def curves(op, reps, out, y_left, y_right):
    """Two panels vs size; y_left/right = (key suffix, label, log-scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    many = len(reps) > 1
    for ax, (suffix, label, logy) in zip(axes, (y_left, y_right)):
        for rep in reps:
            rows = rep.get("results", [])
            xs = [r["bytes"] for r in rows]
            for who, style in (("gin", "o-"), ("nccl", "s--")):
                key = f"{who}_{suffix}"
                if any(key in r for r in rows):
                    pts = [(r["bytes"], r[key]) for r in rows if r.get(key) is not None]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=who + tag(rep, many), ms=4)
            size_axis(ax, xs)
        if logy:
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.legend()
    save(fig, title_of(op, reps), out)


def plot_allreduce(reps, out):
    curves("allreduce", reps, out, ("us", "time per AllReduce (us)", True), ("busbw_gbs", "busBw (GB/s)", False))


def plot_sendrecv(reps, out):
    curves("sendrecv", reps, out, ("us", "latency per ring shift (us)", True), ("gbs", "bandwidth (GB/s)", False))


def plot_put_bw(reps, out):
    fig, ax = plt.subplots(figsize=(9, 5))
    many = len(reps) > 1
    for rep in reps:
        rows = rep.get("results", [])
        keys = []
        for r in rows:
            keys += [k for k, v in r.items() if isinstance(v, dict) and "GBps" in v and k not in keys]
        for k in keys:
            pts = [(r["bytes"], r[k]["GBps"]) for r in rows if isinstance(r.get(k), dict)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if k.startswith("gin") else "s--",
                    label=k.replace("_", " ") + tag(rep, many), ms=4)
        size_axis(ax, [r["bytes"] for r in rows])
    ax.set_ylabel("GB/s")
    ax.legend()
    save(fig, title_of("put-bw", reps), out)


def bars(ax, groups, series, ylabel):
    """groups: x labels; series: [(name, [value or None per group])]."""
    w = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * w for g in range(len(groups))]
        ys = [v if v is not None else 0 for v in vals]
        b = ax.bar(xs, ys, w, label=name)
        ax.bar_label(b, labels=[f"{v:.3g}" if v is not None else "-" for v in vals], fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()


def plot_moe(reps, out):
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    many = len(reps) > 1
    groups, series_t, series_b = [], {}, {}
    for rep in reps:
        for r in rep.get("results", []):
            g = f"{r['mode']}\n{r['phase']}\n{r['tokens']} tok" + (f"\n{rep.get('ranks')} rank(s)" if many else "")
            groups.append(g)
    for who in ("gin", "nccl"):
        t, b = [], []
        for rep in reps:
            for r in rep.get("results", []):
                t.append(r.get(f"{who}_us"))
                b.append(r.get(f"{who}_gbs"))
        if any(v is not None for v in t):
            series_t[who], series_b[who] = t, b
    bars(axes[0], groups, list(series_t.items()), "time per phase (us)")
    bars(axes[1], groups, list(series_b.items()), "GB/s (bytes crossing ranks per rank)")
    save(fig, title_of("moe", reps), out)


def plot_barrier(reps, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    groups, gin, nccl = [], [], []
    for rep in reps:
        for r in rep.get("results", []):
            groups.append(f"{r['ctas']} CTAs" + (f", {rep.get('ranks')}r" if len(reps) > 1 else ""))
            gin.append(r.get("gin_us_per_sync", r.get("gin_us_per_iteration")))
            nccl.append(r.get("nccl_us_per_sync"))
    series = [("gin", gin)] + ([("nccl", nccl)] if any(v is not None for v in nccl) else [])
    bars(ax, groups, series, "us per sync (emulated: per iteration)")
    save(fig, title_of("barrier", reps), out)


def plot_signal_lat(reps, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    modes = [("round_trip_us_median", "release / acquire"), ("already_released_round_trip_us_median",
                                                             "alreadyReleased"),
             ("relaxed_round_trip_us_median", "alreadyReleased,\nrelaxed wait")]
    series = []
    for rep in reps:
        res = rep.get("results") or {}
        series.append((f"gin{tag(rep, len(reps) > 1)}", [res.get(k) for k, _ in modes]))
    bars(ax, [m for _, m in modes], series, "us per round trip")
    save(fig, title_of("signal-lat", reps), out)


def plot_msg_rate(reps, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    groups, series = None, []
    for rep in reps:
        rates = rep.get("rates") or []
        if groups is None:
            groups = [r["producers"] for r in rates]
        series.append((f"gin{tag(rep, len(reps) > 1)}", [r.get("mdesc_per_s_median") for r in rates]))
    bars(ax, groups or [], series, "million descriptors (or WQEs) per second")
    lat = reps[0].get("latency_us_median")
    if lat is not None:
        ax.set_title(f"post-to-consume latency {lat:.3g} us", fontsize=9)
    save(fig, title_of("msg-rate", reps), out)


PLOTS = {
    "allreduce": plot_allreduce,
    "sendrecv": plot_sendrecv,
    "moe": plot_moe,
    "put-bw": plot_put_bw,
    "barrier": plot_barrier,
    "signal-lat": plot_signal_lat,
    "msg-rate": plot_msg_rate,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="gin-bench --json reports")
    ap.add_argument("-o", "--out", default="docs", help="directory for the PNG files (default docs)")
    ap.add_argument("--prefix", default="", help="file name prefix, e.g. h100- (default none)")
    a = ap.parse_args()
    by_op = {}
    for f in a.files:
        with open(f) as fh:
            rep = json.load(fh)
        if rep.get("tool") != "gin-bench" or "op" not in rep:
            sys.exit(f"{f}: not a gin-bench JSON report")
        by_op.setdefault(rep["op"], []).append(rep)
    os.makedirs(a.out, exist_ok=True)
    for op, reps in by_op.items():
        if op not in PLOTS:
            print(f"plot.py: no plot for op {op}, skipped", file=sys.stderr)
            continue
        out = os.path.join(a.out, f"{a.prefix}{op}.png")
        PLOTS[op](reps, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
