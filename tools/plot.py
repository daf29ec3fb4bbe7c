#!/usr/bin/env python3
"""Plots of the benchmarks and of training runs, as SVG files.

Python's standard library only (no matplotlib on these machines); the SVG
opens in any browser.

  # per-rank peak memory, DDP / ZeRO-1 / FSDP / FSDP + auto-wrap (//tools:bench_memory)
  tools/plot.py memory /tmp/mem.json --out /tmp/mem.svg
  # step time of DDP and FSDP (//tools:bench_throughput)
  tools/plot.py throughput /tmp/thr.json --out /tmp/thr.svg
  # tokens/s (and MFU on a GPU) of ours against PyTorch (tools/bench_vs_pytorch.py --json_out)
  tools/plot.py speed /tmp/vs_pytorch.json --out /tmp/speed.svg
  # loss and tokens/s per step of one or more runs (train --metrics_out)
  tools/plot.py loss /tmp/ddp.jsonl /tmp/fsdp.jsonl --labels ddp,fsdp --out /tmp/loss.svg

Exit status 2, with a message naming the file and what is wrong, for a
missing or unreadable input, bad JSON, or JSON of another tool.
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

# Colors of the series, in order (color-blind-safe palette).
PALETTE = ["#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000"]
# bench_memory's strategies, in the order the claims compare them.
STRATEGY_ORDER = ["DDP", "ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD", "FULL_SHARD+wrap"]
MIB = 1024.0 * 1024.0


class PlotError(Exception):
    """Bad input: the message names the file and the problem."""


# ---- SVG ----


class Svg:
    """An SVG document built element by element."""

    def __init__(self, width, height):
        self.width = width
        self.height = height
        self.items = []

    def rect(self, x, y, w, h, fill, title=None, stroke="none"):
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.items.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" '
            f'fill="{fill}" stroke="{stroke}">{tip}</rect>')

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{stroke}" stroke-width="{width}"{d}/>')

    def polyline(self, points, stroke, width=1.5):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.items.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" '
                          f'stroke-width="{width}"/>')

    def circle(self, x, y, r, fill):
        self.items.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"/>')

    def text(self, x, y, s, size=11, anchor="start", weight="normal", rotate=None, fill="#000"):
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        self.items.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" '
                          f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}"{rot}>'
                          f'{escape(str(s))}</text>')

    def write(self, path):
        body = "\n".join(self.items)
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                    f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                    f'font-family="sans-serif">\n'
                    f'<rect width="100%" height="100%" fill="#fff"/>\n{body}\n</svg>\n')


def nice_ticks(lo, hi, count=5):
    """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 0.5:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt(v, step=None):
    """A tick label; with the ticks' step, as many decimals as the step needs, so
    that close ticks (10.65, 10.70, ...) do not print alike."""
    if step is not None and step > 0:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
        q = step / 10 ** -decimals
        if abs(q - round(q)) > 1e-6:  # a step of 0.25 needs one more
            decimals += 1
        return f"{v:.{decimals}f}"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def tick_step(ticks):
    return ticks[1] - ticks[0] if len(ticks) > 1 else None


class Axes:
    """A plot area at (x, y, w, h) mapping data to pixels, with a y axis."""

    def __init__(self, svg, x, y, w, h, ymin, ymax, xmin=0.0, xmax=1.0):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.yticks = nice_ticks(ymin, ymax)
        self.ymin, self.ymax = self.yticks[0], self.yticks[-1]
        self.xmin, self.xmax = xmin, xmax if xmax > xmin else xmin + 1.0

    def px(self, v):
        return self.x + (v - self.xmin) / (self.xmax - self.xmin) * self.w

    def py(self, v):
        return self.y + self.h - (v - self.ymin) / (self.ymax - self.ymin) * self.h

    def draw_y_axis(self, label):
        s = self.svg
        for t in self.yticks:
            yy = self.py(t)
            s.line(self.x, yy, self.x + self.w, yy, stroke="#ddd")
            s.text(self.x - 5, yy + 4, fmt(t, tick_step(self.yticks)), size=10, anchor="end")
        s.line(self.x, self.y, self.x, self.y + self.h)
        s.line(self.x, self.y + self.h, self.x + self.w, self.y + self.h)
        s.text(self.x - 42, self.y + self.h / 2, label, size=11, anchor="middle", rotate=-90)

    def draw_x_ticks(self, label):
        s = self.svg
        for t in nice_ticks(self.xmin, self.xmax):
            if self.xmin <= t <= self.xmax:
                xx = self.px(t)
                s.line(xx, self.y + self.h, xx, self.y + self.h + 4)
                s.text(xx, self.y + self.h + 16, fmt(t), size=10, anchor="middle")
        s.text(self.x + self.w / 2, self.y + self.h + 32, label, size=11, anchor="middle")


def legend(svg, x, y, entries):
    """entries: (label, color) in a row from (x, y)."""
    for label, color in entries:
        svg.rect(x, y - 9, 10, 10, color)
        svg.text(x + 14, y, label, size=11)
        x += 28 + 7.0 * len(label)


# ---- Inputs ----


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise PlotError(f"cannot read '{path}': {e.strerror}")
    except json.JSONDecodeError as e:
        raise PlotError(f"'{path}' is not JSON ({e.msg} at line {e.lineno})")


def load_json(path, want_key, producer):
    """A benchmark's --json_out: an object with a `want_key` list."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get(want_key), list):
        raise PlotError(f"'{path}' has no \"{want_key}\" list: not the --json_out of {producer}")
    return data


def need(row, key, path, what):
    if key not in row:
        raise PlotError(f"'{path}': a {what} lacks \"{key}\"")
    return row[key]


def load_metrics(path):
    """(step, loss, tokens_per_s) per training step of a train --metrics_out
    file (evaluation lines, which carry "eval_loss" instead of "loss", are
    skipped)."""
    points = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    m = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PlotError(f"'{path}' line {n} is not JSON ({e.msg})")
                if isinstance(m, dict) and "eval_loss" in m:
                    continue
                if not isinstance(m, dict) or "step" not in m or "loss" not in m:
                    raise PlotError(f"'{path}' line {n} lacks \"step\" or \"loss\": "
                                    "not a train --metrics_out file")
                step, loss = m["step"], m["loss"]
                if (isinstance(step, bool) or not isinstance(step, (int, float))
                        or isinstance(loss, bool) or not isinstance(loss, (int, float))
                        or not math.isfinite(step) or not math.isfinite(loss)):
                    raise PlotError(f"'{path}' line {n}: step {step!r}, loss {loss!r}: "
                                    "a chart needs finite numbers")
                points.append((step, loss, m.get("tokens_per_s")))
    except OSError as e:
        raise PlotError(f"cannot read '{path}': {e.strerror}")
    if not points:
        raise PlotError(f"'{path}' holds no steps")
    return points


# ---- Charts ----


def plot_memory(path, out):
    """Per-rank peak memory by strategy: a panel per (preset, precision),
    bars grouped by world size; the darker foot of a bar is the model state
    held between steps (parameters + gradients + optimizer state)."""
    data = load_json(path, "rows", "//tools:bench_memory")
    panels = {}
    for r in data["rows"]:
        key = (need(r, "preset", path, "row"), need(r, "precision", path, "row"))
        peak = need(r, "peak_bytes", path, "row")
        state = need(r, "model_state_bytes", path, "row")
        panels.setdefault(key, []).append(
            (need(r, "world_size", path, "row"), need(r, "strategy", path, "row"),
             need(peak, "total", path, "row's peak_bytes") / MIB,
             need(state, "between_steps", path, "row's model_state_bytes") / MIB))
    if not panels:
        raise PlotError(f"'{path}' has no rows")
    strategies = [s for s in STRATEGY_ORDER
                  if any(s == row[1] for rows in panels.values() for row in rows)]
    strategies += sorted({row[1] for rows in panels.values() for row in rows} - set(strategies))
    color = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(strategies)}

    pw, ph, top = 520, 300, 70
    svg = Svg(pw * min(len(panels), 2) + 20, top + (ph + 90) * math.ceil(len(panels) / 2))
    svg.text(14, 24, f"Peak memory per rank (rank 0's ledger), {data.get('optimizer', '')}, "
             f"batch {data.get('batch_size', '?')} x {data.get('seq_len', '?')} per rank",
             size=14, weight="bold")
    legend(svg, 14, 46, [(s, color[s]) for s in strategies] + [("model state between steps",
                                                                 "#0006")])
    # Presets in the file's order, fp32 before bf16.
    presets = list(dict.fromkeys(k[0] for k in panels))
    order = sorted(panels, key=lambda k: (presets.index(k[0]), k[1] != "fp32", k[1]))
    for i, key in enumerate(order):
        rows = panels[key]
        ox = 70 + (i % 2) * pw
        oy = top + 20 + (i // 2) * (ph + 90)
        worlds = sorted({r[0] for r in rows})
        ax = Axes(svg, ox, oy, pw - 100, ph, 0, max(r[2] for r in rows) * 1.12)
        ax.draw_y_axis("peak MiB per rank")
        svg.text(ox + (pw - 100) / 2, oy - 8, f"{key[0]}, {key[1]}", size=12, anchor="middle",
                 weight="bold")
        group_w = (pw - 100) / len(worlds)
        bar_w = group_w * 0.8 / len(strategies)
        for g, world in enumerate(worlds):
            gx = ox + g * group_w + group_w * 0.1
            svg.text(ox + (g + 0.5) * group_w, oy + ph + 16, f"N = {world}", size=11,
                     anchor="middle")
            for j, s in enumerate(strategies):
                hit = [r for r in rows if r[0] == world and r[1] == s]
                if not hit:
                    continue
                _, _, total, state = hit[0]
                x = gx + j * bar_w
                svg.rect(x, ax.py(total), bar_w - 2, ax.py(0) - ax.py(total), color[s],
                         title=f"{s}, N = {world}: peak {total:.1f} MiB, "
                               f"model state {state:.1f} MiB")
                svg.rect(x, ax.py(min(state, total)), bar_w - 2,
                         ax.py(0) - ax.py(min(state, total)), "#0006")
                label = f"{total:.0f}"  # sized to fit the bar's width
                svg.text(x + (bar_w - 2) / 2, ax.py(total) - 3, label,
                         size=round(min(9.0, 1.5 * bar_w / len(label)), 1), anchor="middle")
    svg.write(out)


def plot_throughput(path, out):
    """Median step time per strategy (bars; the dots are single steps) and
    the ratio to DDP, a panel per preset and precision (fp32, bf16; one
    y scale for a preset's panels, so bf16 and fp32 compare by height)."""
    data = load_json(path, "rows", "//tools:bench_throughput")
    panels = {}  # (preset, precision or None) -> rows, in the file's order
    for r in data["rows"]:
        key = (need(r, "preset", path, "row"), r.get("precision"))
        over_fp32 = r.get("over_fp32")
        panels.setdefault(key, []).append(
            (need(r, "strategy", path, "row"), need(r, "median_ms", path, "row"),
             r.get("step_ms", []), r.get("over_ddp"), over_fp32))
    if not panels:
        raise PlotError(f"'{path}' has no rows")
    ymax_of = {}
    for (preset, _), rows in panels.items():
        top_ms = max([r[1] for r in rows] + [v for r in rows for v in r[2]]) * 1.12
        ymax_of[preset] = max(ymax_of.get(preset, 0.0), top_ms)
    pw, ph, top = 560, 300, 60
    svg = Svg(pw * len(panels) + 20, top + ph + 80)
    svg.text(14, 24, f"Step time, world size {data.get('world_size', '?')} (threads engine), "
             f"batch {data.get('batch_size', '?')} x {data.get('seq_len', '?')} per rank",
             size=14, weight="bold")
    for i, ((preset, precision), rows) in enumerate(panels.items()):
        ox, oy = 70 + i * pw, top + 20
        ax = Axes(svg, ox, oy, pw - 100, ph, 0, ymax_of[preset])
        ax.draw_y_axis("ms per step")
        name = f"{preset}, {precision}" if precision else preset
        svg.text(ox + (pw - 100) / 2, oy - 8, name, size=12, anchor="middle", weight="bold")
        bw = (pw - 100) / len(rows)
        for j, (strategy, median, steps, ratio, over_fp32) in enumerate(rows):
            x = ox + j * bw + bw * 0.15
            c = PALETTE[j % len(PALETTE)]
            tip = f"{strategy}: median {median:.1f} ms"
            if over_fp32 is not None:
                tip += f", {over_fp32:.3f} of fp32"
            svg.rect(x, ax.py(median), bw * 0.7, ax.py(0) - ax.py(median), c, title=tip)
            for k, v in enumerate(steps):
                svg.circle(x + bw * 0.7 * (k + 0.5) / max(len(steps), 1), ax.py(v), 2, "#000")
            label = f"{median:.1f} ms" + (f" ({ratio:.3f} of DDP)" if ratio is not None else "")
            svg.text(x + bw * 0.35, ax.py(median) - 5, label, size=9, anchor="middle")
            words = strategy.split(", ")
            for n, w in enumerate(words[:4]):
                svg.text(x + bw * 0.35, oy + ph + 16 + 12 * n, w, size=9, anchor="middle")
    svg.write(out)


def plot_speed(path, out):
    """Tokens/s of each run of bench_vs_pytorch.py (ours and PyTorch's), with
    the ratio to PyTorch eager and, on a GPU, the MFU; the dashed line is the
    issue's target, 1.2x PyTorch eager."""
    data = read_json(path)
    if not isinstance(data, dict) or not data or not all(
            isinstance(v, dict) and "tokens_per_s" in v and "ratio" in v for v in data.values()):
        raise PlotError(f"'{path}' is not the --json_out of tools/bench_vs_pytorch.py "
                        "(runs with \"tokens_per_s\" and \"ratio\")")
    runs = list(data.items())
    # The PyTorch eager baseline: the run whose ratio is 1.
    base = next((v["tokens_per_s"] for _, v in runs if abs(v["ratio"] - 1.0) < 1e-9), None)
    pw, ph, top = 120 * len(runs) + 140, 320, 60
    svg = Svg(pw, top + ph + 90)
    svg.text(14, 24, "Training speed against PyTorch (tools/bench_vs_pytorch.py)", size=14,
             weight="bold")
    ymax = max([v["tokens_per_s"] for _, v in runs] + ([1.25 * base] if base else []))
    ax = Axes(svg, 80, top + 20, pw - 110, ph, 0, ymax * 1.1)
    ax.draw_y_axis("tokens/s")
    if base:
        y = ax.py(1.2 * base)
        svg.line(ax.x, y, ax.x + ax.w, y, stroke="#d55e00", dash="6,4")
        svg.line(14, 44, 40, 44, stroke="#d55e00", dash="6,4")
        svg.text(46, 48, "target: 1.2x PyTorch eager", size=11, fill="#d55e00")
    bw = ax.w / len(runs)
    for j, (name, v) in enumerate(runs):
        x = ax.x + j * bw + bw * 0.15
        c = PALETTE[0] if name.startswith("ours") else PALETTE[5]
        tps = v["tokens_per_s"]
        svg.rect(x, ax.py(tps), bw * 0.7, ax.py(0) - ax.py(tps), c,
                 title=f"{name}: {tps:.1f} tokens/s, {v['ratio']:.2f}x")
        label = f"{tps:.0f} ({v['ratio']:.2f}x)"
        svg.text(x + bw * 0.35, ax.py(tps) - 16 if "mfu" in v else ax.py(tps) - 4, label, size=10,
                 anchor="middle")
        if "mfu" in v:
            svg.text(x + bw * 0.35, ax.py(tps) - 4, f"MFU {100 * v['mfu']:.1f}%", size=10,
                     anchor="middle")
        for n, part in enumerate(name.split("_")[:4]):
            svg.text(x + bw * 0.35, ax.y + ax.h + 16 + 12 * n, part, size=10, anchor="middle")
    svg.write(out)


def plot_loss(paths, labels, out):
    """Loss (top) and tokens/s (bottom) per step of each run."""
    runs = [load_metrics(p) for p in paths]
    if labels is None:
        labels = [os.path.basename(p) for p in paths]
    if len(labels) != len(paths):
        raise PlotError(f"{len(labels)} labels for {len(paths)} files")
    steps = [p[0] for run in runs for p in run]
    losses = [p[1] for run in runs for p in run]
    speeds = [p[2] for run in runs for p in run[1:] if p[2] is not None]  # the first step warms up
    w, h = 760, 640
    svg = Svg(w, h)
    svg.text(14, 24, "Training runs", size=14, weight="bold")
    legend(svg, 14, 46, [(l, PALETTE[i % len(PALETTE)]) for i, l in enumerate(labels)])
    lo, hi = min(losses), max(losses)
    pad = (hi - lo) * 0.05 or 0.05
    ax = Axes(svg, 80, 70, w - 120, 230, lo - pad, hi + pad, min(steps), max(steps))
    ax.draw_y_axis("loss")
    ax.draw_x_ticks("step")
    if speeds:
        bx = Axes(svg, 80, 370, w - 120, 200, 0, max(speeds) * 1.1, min(steps), max(steps))
        bx.draw_y_axis("tokens/s")
        bx.draw_x_ticks("step (the first step of each run left out)")
    for i, run in enumerate(runs):
        c = PALETTE[i % len(PALETTE)]
        svg.polyline([(ax.px(s), ax.py(l)) for s, l, _ in run], c)
        if len(run) == 1:
            svg.circle(ax.px(run[0][0]), ax.py(run[0][1]), 3, c)
        if speeds:
            pts = [(bx.px(s), bx.py(t)) for s, _, t in run[1:] if t is not None]
            if pts:
                svg.polyline(pts, c)
    svg.write(out)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="chart", required=True)
    m = sub.add_parser("memory", help="//tools:bench_memory --json_out")
    m.add_argument("json")
    t = sub.add_parser("throughput", help="//tools:bench_throughput --json_out")
    t.add_argument("json")
    v = sub.add_parser("speed", help="tools/bench_vs_pytorch.py --json_out")
    v.add_argument("json")
    l = sub.add_parser("loss", help="train --metrics_out files")
    l.add_argument("jsonl", nargs="+")
    l.add_argument("--labels", help="comma-separated, one per file (default: file names)")
    for p in (m, t, v, l):
        p.add_argument("--out", required=True, help="the SVG file to write")
    args = parser.parse_args(argv)
    try:
        if args.chart == "memory":
            plot_memory(args.json, args.out)
        elif args.chart == "throughput":
            plot_throughput(args.json, args.out)
        elif args.chart == "speed":
            plot_speed(args.json, args.out)
        else:
            labels = args.labels.split(",") if args.labels else None
            plot_loss(args.jsonl, labels, args.out)
    except PlotError as e:
        print(f"plot: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"plot: error: cannot write '{args.out}': {e.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
