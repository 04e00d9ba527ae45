"""Plots a metric of several runs against wall-clock time, as an SVG (standard library only).

    python3 scripts/plot_runs.py OUT.svg NAME=RUN/metrics.jsonl ... [--y reward/mean]
        [--x time/elapsed] [--title TEXT] [--smooth 5]

Each run's training lines (those with `train/loss`) give one curve: `--x` (default the seconds
since the run started, `time/elapsed`; `rollout` for steps) against `--y` (default `reward/mean`),
as a moving average over `--smooth` lines (the raw points drawn faintly behind it).
"""

import argparse
import json
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
W, H, L, R, T, B = 720, 420, 64, 160, 40, 48


def load(path, x, y):
    points = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            m = json.loads(line)
            if "train/loss" not in m:
                continue
            if x not in m or y not in m:
                sys.exit(f"{path}:{n}: no {x!r} or {y!r} in this metrics line")
            points.append((float(m[x]), float(m[y])))
    if not points:
        sys.exit(f"{path}: no training lines")
    return points


def smooth(points, k):
    out = []
    for i in range(len(points)):
        window = points[max(0, i - k + 1):i + 1]
        out.append((points[i][0], sum(p[1] for p in window) / len(window)))
    return out


def ticks(lo, hi, n=5):
    step = (hi - lo) / n or 1.0
    return [lo + i * step for i in range(n + 1)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+", help="NAME=PATH to a metrics.jsonl")
    parser.add_argument("--x", default="time/elapsed")
    parser.add_argument("--y", default="reward/mean")
    parser.add_argument("--title", default="")
    parser.add_argument("--smooth", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"{spec!r}: expected NAME=PATH")
        runs.append((name, load(path, args.x, args.y)))
    xs = [p[0] for _, pts in runs for p in pts]
    ys = [p[1] for _, pts in runs for p in pts]
    x0, x1 = min(0.0, min(xs)), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    px = lambda x: L + (x - x0) / ((x1 - x0) or 1.0) * (W - L - R)
    py = lambda y: H - B - (y - y0) / ((y1 - y0) or 1.0) * (H - T - B)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{args.title}</text>']
    for t in ticks(x0, x1):
        svg.append(f'<line x1="{px(t):.1f}" y1="{T}" x2="{px(t):.1f}" y2="{H - B}" stroke="#eee"/>')
        svg.append(f'<text x="{px(t):.1f}" y="{H - B + 16}" text-anchor="middle">{t:.0f}</text>')
    for t in ticks(y0, y1):
        svg.append(f'<line x1="{L}" y1="{py(t):.1f}" x2="{W - R}" y2="{py(t):.1f}" stroke="#eee"/>')
        svg.append(f'<text x="{L - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">{args.x}'
               f'{" (s)" if args.x.startswith("time/") else ""}</text>')
    svg.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(T + H - B) / 2})">{args.y}</text>')
    for i, (name, pts) in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        raw = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in smooth(pts, args.smooth))
        svg.append(f'<polyline points="{raw}" fill="none" stroke="{color}" stroke-opacity="0.25"/>')
        svg.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = T + 16 + 20 * i
        svg.append(f'<line x1="{W - R + 12}" y1="{ly}" x2="{W - R + 32}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2"/>')
        svg.append(f'<text x="{W - R + 38}" y="{ly + 4}">{name}</text>')
    svg.append("</svg>")
    with open(args.out + ".tmp", "w") as f:
        f.write("\n".join(svg) + "\n")
    import os
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
