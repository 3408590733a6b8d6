#!/usr/bin/env python3
"""Merge the outputs of bench/gpu-compare's parts into one table and one JSON file.

    gpu_report.py --plain PLAIN.log --fsdp FSDP.log --out RESULTS.json [--device-name NAME] [--torch VERSION]

PLAIN.log is the stdout of `zero-bench fit-plain --json`, FSDP.log that of
`bench/fsdp2_offload.py --json`. Each prints one JSON line per size as it
finishes and one object of all at the end; when a part was cut off by its
timeout, the per-size lines it had printed are used and the part is marked
"cut off". Part (b), zerocpp ZeRO-2 + CPU offload + DPU on the GPU, is not
available (the engine has no CUDA path yet, docs/gpu.md) and is reported so.
Only the standard library is used.
"""
import argparse
import json
import sys
import time

B_NOT_AVAILABLE = "not available: the engine has no CUDA path yet (docs/gpu.md)"


def read_part(path):
    """(summary object or None, per-size dicts, skipped reason or None, cut_off, matmul line or None)."""
    summary, sizes, skipped, matmul = None, [], None, None
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, [], f"no output ({path} missing)", True, None
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
    return summary, sizes, skipped, summary is None and skipped is None, matmul


def cell(r, peak):
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return r.get("status", "?")
    mfu = r["tflops"] / peak if peak else None
    mem = r.get("peak_mem_gib")
    return (f"{r['tflops']:.3g} TF" + (f" {100 * mfu:.0f}%" if mfu is not None else "") +
            (f" {mem:.1f}G" if mem is not None else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", required=True)
    ap.add_argument("--fsdp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device-name", default="")
    ap.add_argument("--torch", default="")
    a = ap.parse_args()

    p_sum, p_sizes, p_skip, p_cut, p_mm = read_part(a.plain)
    f_sum, f_sizes, f_skip, f_cut, _ = read_part(a.fsdp)
    p_mm = p_sum or p_mm or {}
    peak = p_mm.get("matmul_peak_tflops")
    plain_by = {r["size"]: r for r in p_sizes}
    fsdp_by = {r["size"]: r for r in f_sizes}
    order = [r["size"] for r in p_sizes] + [r["size"] for r in f_sizes if r["size"] not in plain_by]

    mismatched = [s for s in order if s in plain_by and s in fsdp_by and plain_by[s]["params"] != fsdp_by[s]["params"]]
    print(f"device: {a.device_name or '?'}   torch: {a.torch or '?'}")
    print("bf16 matmul peak: " + (f"{peak:.3g} TFLOP/s" if peak else "not measured") +
          "".join(f"  [{m['n']}: {m['tflops']:.2f}]" for m in p_mm.get("matmul_bf16", [])))
    print("cells: TFLOP/s, MFU against that peak, peak device memory GiB")
    head = f"{'size':<16} {'params M':>9} {'(a) plain LibTorch':>24} {'(b) zerocpp Z2+off+DPU':>24} {'(c) FSDP2 offload':>24}"
    print(head)
    for s in order:
        pr, fr = plain_by.get(s), fsdp_by.get(s)
        params = (pr or fr)["params"]
        print(f"{s:<16} {params / 1e6:9.1f} {cell(pr, peak):>24} {'n/a':>24} {cell(fr, peak):>24}")
    for name, summ, skip, cut in (("(a)", p_sum, p_skip, p_cut), ("(c)", f_sum, f_skip, f_cut)):
        if skip:
            print(f"{name} skipped: {skip}")
        elif cut:
            print(f"{name} cut off (timeout or crash): only the sizes it finished are shown")
        else:
            print(f"{name} largest that fits: {summ.get('largest_fit')}")
    print(f"(b) {B_NOT_AVAILABLE}")
    if mismatched:
        print(f"ERROR: parameter counts differ between (a) and (c) for {', '.join(mismatched)}", file=sys.stderr)

    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device_name": a.device_name,
        "torch": a.torch,
        "matmul_peak_tflops": peak,
        "matmul_bf16": p_mm.get("matmul_bf16"),
        "a_plain_libtorch": {"summary": p_sum, "sizes": p_sizes, "skipped": p_skip, "cut_off": p_cut},
        "b_zerocpp_zero2_offload_dpu": {"status": B_NOT_AVAILABLE},
        "c_fsdp2_cpu_offload": {"summary": f_sum, "sizes": f_sizes, "skipped": f_skip, "cut_off": f_cut},
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results: {a.out}")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
