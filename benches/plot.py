#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the JSON of `cargo xtask bench-data --out`
and `cargo xtask bench-stoppage --out` (needs gnuplot).

  benches/plot.py data NEW.json OUT.png [--old OLD.json] [--size BYTES]
      crane's speed as a share of native's per transfer path at one size
      (default 256 MiB), for one build or two.
  benches/plot.py stoppage STOPPAGE.json OUT.png [REWRITE [TITLE]]
      crane's account of each step's stoppage (ms) by memory size, at one
      rewrite rate (default 0): the first suspend of each size, a suspend
      right after a pre-copy, and resume, move to crane-proxy and move back,
      each with and without a pre-copy (means of the repeats; the steps the
      run has). TITLE names the machine (default: NVIDIA H200).
  benches/plot.py lanes OUT.png TITLE LABEL=A.json[,B.json] ...
      the application's pause around each move to crane-proxy by memory
      size, one line per LABEL (runs of `--steps remote` with the same
      settings, e.g. lanes off and on), the first move of each size (every
      buffer dirty on the device) apart from the next ones (means).
"""
import json
import subprocess
import sys
import tempfile


def gnuplot(script: str) -> None:
    subprocess.run(["gnuplot"], input=script.encode(), check=True)


def data(args):
    import argparse

    a = argparse.ArgumentParser(prog="plot.py data")
    a.add_argument("new")
    a.add_argument("out")
    a.add_argument("--old")
    a.add_argument("--size", type=int, default=268435456)
    a = a.parse_args(args)
    new = json.load(open(a.new))
    old = json.load(open(a.old)) if a.old else None
    out, size = a.out, a.size

    def ratios(d):
        return {f["path"]: 100.0 * f["native_s"] / f["crane_s"] for f in d["figures"] if f["bytes"] == size}

    n = ratios(new)
    o = ratios(old) if old else {}
    with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as t:
        for path, r in n.items():
            t.write(f'"{path}" {o.get(path, float("nan")):.2f} {r:.2f}\n')
        dat = t.name
    label = f"{size // 1048576} MiB" if size >= 1048576 else f"{size // 1024} KiB"
    cols = (
        f"'{dat}' using 2:xtic(1) title 'before (14f4995)', '' using 3 title 'after'"
        if old
        else f"'{dat}' using 3:xtic(1) title 'crane'"
    )
    gnuplot(
        f"""set terminal pngcairo size 1100,520 font ',10'
set output '{out}'
set title "Transfers under crane as % of native speed, {label}, {new['device']}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set yrange [0:130]
set ylabel '% of native'
set xtics rotate by -40 left
set grid ytics
set key at graph 0.99, graph 0.99 horizontal opaque box
plot {cols}, 100 with lines dt 2 lc rgb 'black' notitle
"""
    )


def stoppage(args):
    steps = json.load(open(args[0]))
    out = args[1]
    rate = float(args[2]) if len(args) > 2 else 0.0
    machine = args[3] if len(args) > 3 else "NVIDIA H200"
    names = {
        "suspend": "suspend (first: all dirty)",
        "pc-suspend": "suspend after a pre-copy",
        "resume": "resume",
        "remote": "move to crane-proxy",
        "pc-remote": "move to crane-proxy after a pre-copy",
        "local": "move back",
        "pc-local": "move back after a pre-copy",
    }
    series = {n: {} for n in names.values()}
    seen = set()
    for s in steps:
        name = names.get(s["step"])
        if s["rewrite_percent"] != rate or name is None:
            continue
        if s["step"] == "suspend":
            if s["mib"] in seen:
                continue
            seen.add(s["mib"])
        # The mean of the repeats of a step at one size.
        series[name].setdefault(s["mib"], []).append(s["crane_ms"])
    series = {
        n: [(mib, sum(v) / len(v)) for mib, v in sorted(pts.items())]
        for n, pts in series.items()
    }
    by_size(
        out,
        f"Stoppage by memory held (crane per-phase account), {machine}, {rate:g}% rewritten per second",
        "stoppage (ms)",
        {n: pts for n, pts in series.items() if pts},
    )


def by_size(out, title, ylabel, series):
    """One line per series (name: [(MiB, ms)]) on log-log axes of memory held."""
    files = []
    for name, pts in series.items():
        with tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False) as t:
            for x, y in pts:
                t.write(f"{x} {y}\n")
            files.append((name, t.name))
    plots = ", ".join(f"'{f}' using 1:2 with linespoints title '{n}'" for n, f in files)
    gnuplot(
        f"""set terminal pngcairo size 900,520 font ',10'
set output '{out}'
set title '{title}'
set logscale xy
set xlabel 'device memory held by the application (MiB)'
set ylabel '{ylabel}'
set grid
set key top left
plot {plots}
"""
    )


def lanes(args):
    out, title, runs = args[0], args[1], args[2:]
    series = {}
    for run in runs:
        label, paths = run.split("=", 1)
        first, later = {}, {}
        for path in paths.split(","):
            seen = set()
            for s in json.load(open(path)):
                if s["step"] != "remote":
                    continue
                key = (s["mib"], s["rewrite_percent"])
                into = later if key in seen else first
                seen.add(key)
                into.setdefault(s["mib"], []).append(s["app_pause_ms"])
        for name, pts in ((f"{label}, first move", first), (f"{label}, next moves", later)):
            series[name] = [(mib, sum(v) / len(v)) for mib, v in sorted(pts.items())]
    by_size(
        out,
        f"Move to crane-proxy without pre-copy: pause of the application, {title}",
        "pause (ms)",
        series,
    )


if __name__ == "__main__":
    kind, rest = sys.argv[1], sys.argv[2:]
    {"data": data, "stoppage": stoppage, "lanes": lanes}[kind](rest)
