#!/usr/bin/env python3
"""The peer for `zero-bench adam`: DeepSpeed's CPU Adam (DeepSpeedCPUAdam) on
one flat fp32 parameter of n elements, AdamW mode (or, with --optimizer lion,
DeepSpeedCPULion), timed like zero-bench times ours (median of --iters steps
after --warmup). Prints one JSON line:

  {"n": ..., "threads": ..., "mps": <M params/s>, "median_s": ..., "deepspeed": "<version>"}

or {"error": "..."} (exit status 2) when DeepSpeed cannot run here.

Install DeepSpeed with bench/setup-deepspeed. DeepSpeed picks its CPU
accelerator (DS_ACCELERATOR=cpu, set below when unset) because the torch wheel
is a CUDA build and there is no GPU here; its cpu_adam (cpu_lion) op is built just in time
(ninja, torch C++ headers) on first use and cached in ~/.cache/torch_extensions.
DeepSpeed's op spreads each step over OpenMP threads; torch.set_num_threads
sets their number.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True, help="parameters")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--optimizer", choices=["adamw", "lion"], default="adamw")
    args = ap.parse_args()
    name = "DeepSpeedCPULion" if args.optimizer == "lion" else "DeepSpeedCPUAdam"

    try:
        import torch
        torch.set_num_threads(args.threads)
        import deepspeed
        if args.optimizer == "lion":
            from deepspeed.ops.lion import DeepSpeedCPULion
        else:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # noqa: BLE001 - report any import failure as data
        print(json.dumps({"error": f"cannot import DeepSpeed: {type(e).__name__}: {e}"}))
        return 2

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(args.n, dtype=torch.float32))
    p.grad = torch.rand(args.n, dtype=torch.float32) * 2 - 1
    try:
        # Same hyper-parameters as zero-bench's own runs: AdamW, lr 1e-3, wd
        # 0.01; Lion, lr 1e-4, betas (0.9, 0.99), wd 0.1.
        if args.optimizer == "lion":
            opt = DeepSpeedCPULion([p], lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1,
                                   fp32_optimizer_states=True)
        else:
            opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                   adamw_mode=True, fp32_optimizer_states=True)
        times = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            opt.step()
            t1 = time.perf_counter()
            if i >= args.warmup:
                times.append(t1 - t0)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"error": f"{name} failed: {type(e).__name__}: {e}"}))
        return 2
    med = statistics.median(times) if times else float("nan")
    print(json.dumps({"n": args.n, "threads": args.threads, "mps": args.n / med / 1e6,
                      "median_s": med, "deepspeed": deepspeed.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
