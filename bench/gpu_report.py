#!/usr/bin/env python3
"""Merge the parts of one bench/gpu run into its tables and one JSON file.

    gpu_report.py --dir RESULTS --stamp STAMP --out RESULTS/gpu-STAMP.json [--seconds S]

Each part's log is RESULTS/<part>-STAMP.log, the stdout of a bench program run
with --json: one JSON line per size as it finishes and one object of all at the
end (a part cut off by its timeout leaves only its per-size lines, and is
marked "cut off"). The parts:

    cpp-torch-adamw    zero-bench fit-plain --optimizer torch (and the matmul peak)
    cpp-fused-adamw    zero-bench fit-plain --optimizer fused
    cpp-zero-adam      zero-bench fit-plain --optimizer zero
    cpp-engine         zero-bench fit-plain --optimizer engine --stage 0 (zero::Engine)
    python-plain       bench/plain_pytorch.py
    python-plain-ckpt  bench/plain_pytorch.py --checkpoint
    cpp-zero-adam-ckpt zero-bench fit-plain --optimizer zero --checkpoint
    cpp-engine-offload zero-bench fit-plain --optimizer engine --stage 2 --offload cpu --checkpoint
    cpp-engine-offload-dpu  the same with --dpu
    cpp-engine-stage3-param the same at --stage 3 with --offload-param
    cpp-engine-offload-share the DPU part with --offload-ratio (Twin-Flow: the rest stepped on the GPU);
                       one log per ratio (cpp-engine-offload-share-rR-STAMP.log), one row each
    deepspeed-offload  bench/deepspeed_offload.py --checkpoint
    fsdp2-offload      bench/fsdp2_offload.py --checkpoint

Table 1 puts the C++ GPT beside the same model in Python, one row per loop,
with the speed relative to Python's (Python step / this step: 1.00 = as fast)
and the forward / backward / optimizer split. Table 2 puts the offload peers beside plain PyTorch and the C++ GPT's plain
loop and zerocpp's engine with ZeRO-2 + CPU offload (with and without the delayed
parameter update) and with ZeRO-3 + parameter and optimizer offload + DPU, all with
activation checkpointing, each with its step over plain PyTorch's and DeepSpeed's
("of plain", "x DS": the same run, the same size).
Only the standard library is used.
"""
import argparse
import glob
import json
import os
import re
import sys
import time

PARTS = ["cpp-torch-adamw", "cpp-fused-adamw", "cpp-zero-adam", "cpp-engine", "python-plain", "python-plain-ckpt",
         "cpp-zero-adam-ckpt", "cpp-engine-offload", "cpp-engine-offload-dpu", "cpp-engine-stage3-param",
         "cpp-engine-offload-share", "cpp-engine-share-published", "deepspeed-offload", "fsdp2-offload"]


def read_part(path):
    """{summary, sizes, skipped, cut_off, matmul} of one part's log."""
    summary, sizes, skipped, matmul = None, [], None, None
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return {"summary": None, "sizes": [], "skipped": f"no output ({os.path.basename(path)} missing)",
                "cut_off": False, "matmul": None}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "matmul_peak_tflops" in obj and "bench" not in obj:
            matmul = obj
        elif "skipped" in obj:
            skipped = obj["skipped"]
        elif "bench" in obj:
            summary = obj
        elif "size" in obj:
            sizes.append(obj)
    if summary is not None:
        sizes = summary.get("sizes", sizes)
    return {"summary": summary, "sizes": sizes, "skipped": skipped,
            "cut_off": summary is None and skipped is None, "matmul": matmul}


def by_size(part):
    return {r["size"]: r for r in part["sizes"]}


def step_cell(r):
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return r.get("status", "?")
    return f"{r['step_ms']:.1f} ms {r['tflops']:.0f} TF"


def split_cell(r):
    b = (r or {}).get("breakdown_ms")
    if not b:
        return "-"
    return f"{b['forward']:.0f}/{b['backward']:.0f}/{b['optimizer']:.0f}"


def ratio(ref, r):
    if not ref or not r or ref.get("status") != "ok" or r.get("status") != "ok":
        return "-"
    return f"{ref['step_ms'] / r['step_ms']:.3f}"


def part_status(name, p):
    if p["skipped"]:
        return f"{name}: skipped: {p['skipped']}"
    if p["cut_off"]:
        return f"{name}: cut off (timeout or crash): only the sizes it finished are shown"
    return f"{name}: largest that fits: {p['summary'].get('largest_fit')}"


def print_rows(parts, loops, label_width, ratio_column, extra_columns, trailer=None):
    """One row per size and loop: step, TFLOP/s, the first loop's step over this one's, and the extra
    (header, width, cell(r)) columns; `trailer` adds a not-available row per size. Returns the sizes whose
    parameter counts differ between loops."""
    rows = {part: by_size(parts[part]) for _, part in loops}
    base = rows[loops[0][1]]
    order = list(dict.fromkeys(s for _, part in loops for s in rows[part]))
    ratio_header, ratio_width = ratio_column
    print(f"{'size':<15} {'params M':>9} {'loop':<{label_width}} {'step ms':>9} {'TFLOP/s':>8} "
          f"{ratio_header:>{ratio_width}}" + "".join(f" {h:>{w}}" for h, w, _ in extra_columns))
    for s in order:
        for label, part in loops:
            r = rows[part].get(s)
            if r is None:
                continue
            if r.get("status") != "ok":
                print(f"{s:<15} {r['params'] / 1e6:9.1f} {label:<{label_width}} {r.get('status', '?'):>9}")
                continue
            extra = "".join(f" {cell(r):>{w}}" for _, w, cell in extra_columns)
            print(f"{s:<15} {r['params'] / 1e6:9.1f} {label:<{label_width}} {r['step_ms']:9.1f} {r['tflops']:8.0f} "
                  f"{ratio(base.get(s), r):>{ratio_width}}{extra}")
        if trailer:
            print(f"{s:<15} {'':>9} {trailer:<{label_width}} {'n/a':>9}")
    return [s for s in order if len({rows[p][s]["params"] for _, p in loops if s in rows[p]}) > 1]


def variant_parts(parts, directory, stamp, prefix, label):
    """The logs PREFIX<value>-STAMP.log of one part run at several values, read into `parts`
    in value order; their (label, part name) rows."""
    found = []
    for path in glob.glob(os.path.join(directory, f"{prefix}*-{stamp}.log")):
        m = re.fullmatch(re.escape(prefix) + r"([0-9.e+]+)-" + re.escape(stamp) + r"\.log", os.path.basename(path))
        if m:
            found.append((float(m.group(1)), m.group(1), path))
    rows = []
    for _, value, path in sorted(found):
        name = prefix + value
        parts[name] = read_part(path)
        rows.append((label.format(value), name))
    return rows


def read_machine(path):
    """bench/gpu's record of the torch version and the device, written before any part runs."""
    try:
        with open(path) as f:
            m = json.load(f)
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--stamp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=None, help="wall time of the whole bench/gpu run")
    a = ap.parse_args()

    parts = {n: read_part(os.path.join(a.dir, f"{n}-{a.stamp}.log")) for n in PARTS}
    # Twin-Flow: one log per ratio (bench/gpu's keep_share_log); stage 3 at
    # several stage3_prefetch_bucket_size values (ZERO_GPU_STAGE3_PREFETCH),
    # beside the default's. In value order.
    share_parts = variant_parts(parts, a.dir, a.stamp, "cpp-engine-offload-share-r",
                                "zerocpp Z2 + offload + DPU, ratio {}")
    if share_parts:
        del parts["cpp-engine-offload-share"]
    published_parts = variant_parts(parts, a.dir, a.stamp, "cpp-engine-share-published-r",
                                    "zerocpp Z2 + offload + DPU, ratio {}, in backward")
    if published_parts:
        del parts["cpp-engine-share-published"]
    prefetch_parts = variant_parts(parts, a.dir, a.stamp, "cpp-engine-stage3-param-p",
                                   "zerocpp Z3 + offload_param + DPU, prefetch {}")
    ct = parts["cpp-torch-adamw"]
    mm = ct["summary"] or ct["matmul"] or {}
    peak = mm.get("matmul_peak_tflops")
    machine = read_machine(os.path.join(a.dir, f"machine-{a.stamp}.json"))
    device = next((p["summary"].get("device_name") for p in parts.values()
                   if p["summary"] and p["summary"].get("device_name")), machine.get("device_name") or "?")
    torch_version = next((p["summary"].get("torch") for p in parts.values()
                          if p["summary"] and p["summary"].get("torch")), machine.get("torch") or "?")
    print(f"device: {device}   torch: {torch_version}")
    print("bf16 matmul peak: " + (f"{peak:.0f} TFLOP/s" if peak else "not measured") +
          "".join(f"  [{m['n']}^3: {m['tflops']:.0f}]" for m in mm.get("matmul_bf16", []) or []))

    loops = [("PyTorch AdamW(fused=True)", "python-plain"), ("C++ at::_fused_adamw_", "cpp-fused-adamw"),
             ("C++ zero::cuda Adam", "cpp-zero-adam"), ("zerocpp Engine stage 0", "cpp-engine"),
             ("C++ torch::optim::AdamW", "cpp-torch-adamw")]
    print("\nTable 1. The C++ GPT and the same model in Python, plain loops, no activation checkpointing")
    print("speed = Python step / this step (1.00 = as fast); split = forward/backward/optimizer ms (synced apart)")
    mismatch = print_rows(parts, loops, 26, ("speed", 6), [("split", 12, split_cell)])

    def gib(key):
        return lambda r: ("%.1f" % r[key]) if r.get(key) is not None else "-"

    loops2 = [("plain PyTorch", "python-plain-ckpt"), ("C++ plain, zero::cuda Adam", "cpp-zero-adam-ckpt"),
              ("zerocpp Z2 + CPU offload", "cpp-engine-offload"), ("zerocpp Z2 + offload + DPU", "cpp-engine-offload-dpu"),
              ("zerocpp Z3 + offload_param + DPU", "cpp-engine-stage3-param"), *prefetch_parts,
              *(share_parts or [("zerocpp Z2 + offload + DPU, ratio<1", "cpp-engine-offload-share")]),
              *(published_parts or [("zerocpp Z2 + offload + DPU, in backward", "cpp-engine-share-published")]),
              ("DeepSpeed Z2 + CPU offload", "deepspeed-offload"), ("FSDP2 + CPUOffloadPolicy", "fsdp2-offload")]
    print("\nTable 2. With activation checkpointing per block: the offload peers beside the plain loops")
    print("of plain = plain PyTorch's step / this step; GPU = peak allocated GiB; host = peak RSS GiB; "
          "x DS = DeepSpeed's step (same run, same size) / this step")
    deepspeed = by_size(parts["deepspeed-offload"])

    def times_deepspeed(r):
        d = deepspeed.get(r.get("size"))
        if not d or d.get("status") != "ok" or not r.get("step_ms"):
            return "-"
        return "%.2f" % (d["step_ms"] / r["step_ms"])

    print_rows(parts, loops2, max(38, *(len(label) for label, _ in loops2)), ("of plain", 8),
               [("GPU", 6, gib("peak_mem_gib")), ("host", 6, gib("host_peak_rss_gib")), ("x DS", 6, times_deepspeed)])
    print()
    for n in parts:
        print(part_status(n, parts[n]))
    if mismatch:
        print(f"ERROR: parameter counts differ between the C++ and Python models for {', '.join(mismatch)}",
              file=sys.stderr)

    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device_name": device, "torch": torch_version,
           "seconds": a.seconds, "matmul_peak_tflops": peak, "matmul_bf16": mm.get("matmul_bf16"),
           "parts": parts}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results: {a.out}")
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
