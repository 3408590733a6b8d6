#!/usr/bin/env python3
"""Draw one engine timeline (zero-bench fit-plain --timeline PREFIX) as SVG.

    python3 bench/timeline_svg.py PREFIX-SIZE.json --out step.svg [--title "..."]

One row per lane: the compute stream (forward, backward, the engine's step),
the copies down (gradient chunks to host memory) and up (parameter chunks
back), stage 3's gathers of an offloaded partition (one box per bucket),
the CPU optimizer step (one box per bucket) and where the main thread
waited for the delayed update. Times are milliseconds since tracing began;
the dashed lines are the steps' host-clock boundaries. Standard library only.
"""
import argparse
import html
import json
import sys

LANES = ["compute", "gather", "copy down", "copy up", "cpu step", "device step", "host wait"]
LANE_NAMES = {
    "compute": "compute stream",
    "gather": "gathers (params up)",
    "copy down": "copy down (grads)",
    "copy up": "copy up (params)",
    "cpu step": "CPU Adam",
    "device step": "device Adam (device share)",
    "host wait": "host waits for DPU",
}
COLOURS = {
    "forward": "#4e79a7",
    "backward": "#f28e2b",
    "step": "#bab0ac",
    "copy down": "#59a14f",
    "copy up": "#b07aa1",
    "gather": "#edc948",
    "cpu step": "#e15759",
    "device step": "#ff9da7",
    "host wait": "#9c755f",
}


def colour(iv):
    if iv["lane"] == "compute":
        return COLOURS.get(iv["what"], "#76b7b2")
    return COLOURS.get(iv["lane"], "#76b7b2")


def draw(doc, title):
    ivs = doc["intervals"]
    if not ivs:
        raise SystemExit("timeline_svg: the file has no intervals")
    lanes = [l for l in LANES if any(i["lane"] == l for i in ivs)]
    lanes += sorted({i["lane"] for i in ivs} - set(lanes))
    t_end = max([i["end_ms"] for i in ivs] + [b[1] for b in doc.get("steps_ms", [])])
    left, right, top, row, gap = 150, 30, 60, 34, 8
    width = 1200
    scale = (width - left - right) / t_end
    height = top + len(lanes) * (row + gap) + 70
    x = lambda t: left + t * scale
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="24" font-size="15">{html.escape(title)}</text>']
    for k, lane in enumerate(lanes):
        y = top + k * (row + gap)
        out.append(f'<text x="{left - 8}" y="{y + row / 2 + 4}" text-anchor="end">'
                   f'{html.escape(LANE_NAMES.get(lane, lane))}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{width - left - right}" height="{row}" fill="#f4f4f4"/>')
        for i in (i for i in ivs if i["lane"] == lane):
            w = max((i["end_ms"] - i["start_ms"]) * scale, 0.5)
            tip = f'{i["lane"]} {i["what"]} (step {i["step"]}): {i["start_ms"]:.1f}-{i["end_ms"]:.1f} ms'
            out.append(f'<rect x="{x(i["start_ms"]):.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 4}" '
                       f'fill="{colour(i)}" stroke="white" stroke-width="0.3"><title>{html.escape(tip)}</title></rect>')
            if lane == "compute" and w > 60:
                out.append(f'<text x="{x(i["start_ms"]) + 4:.2f}" y="{y + row / 2 + 4}" fill="white">'
                           f'{html.escape(i["what"])}</text>')
    axis_y = top + len(lanes) * (row + gap) + 4
    for b in doc.get("steps_ms", []):
        for t in b:
            out.append(f'<line x1="{x(t):.2f}" y1="{top - 6}" x2="{x(t):.2f}" y2="{axis_y}" stroke="#333" '
                       f'stroke-dasharray="4,3"/>')
    step = 10 ** max(0, len(str(int(t_end))) - 1)
    if t_end / step < 4:
        step /= 2
    t = 0.0
    while t <= t_end:
        out.append(f'<line x1="{x(t):.2f}" y1="{axis_y}" x2="{x(t):.2f}" y2="{axis_y + 5}" stroke="#333"/>')
        out.append(f'<text x="{x(t):.2f}" y="{axis_y + 18}" text-anchor="middle">{t:g}</text>')
        t += step
    out.append(f'<text x="{left}" y="{axis_y + 36}">ms since tracing began; dashed: step boundaries '
               f'(host clock)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", help="a PREFIX-SIZE.json from zero-bench fit-plain --timeline PREFIX")
    ap.add_argument("--out", required=True, help="the SVG to write")
    ap.add_argument("--title", default=None, help="default: size, parameters, variant, device")
    ap.add_argument("--device-name", default=None, help="the device's name in the default title")
    a = ap.parse_args()
    doc = json.load(open(a.timeline))
    variant = f'stage {doc.get("stage")}' + (" + CPU offload" if doc.get("offload") == "cpu" else "") + \
              (" + DPU" if doc.get("dpu") else "")
    title = a.title or (f'zerocpp {variant}, GPT {doc["size"]} ({doc["params"] / 1e9:.2f}B params) on '
                        f'{a.device_name or doc["device"]}: median step {doc["median_step_ms"]:.0f} ms')
    with open(a.out, "w") as f:
        f.write(draw(doc, title))
    print(f"timeline_svg: {len(doc['intervals'])} intervals -> {a.out}")


if __name__ == "__main__":
    sys.exit(main())
