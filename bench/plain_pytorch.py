#!/usr/bin/env python3
"""Plain PyTorch training loop on zerocpp's GPT: the speed every GPU figure is compared with.

    python3 bench/plain_pytorch.py --device cuda --sizes 24x2048,32x2560 --micro-batch 8 [--json]
    python3 bench/plain_pytorch.py --device cuda --sizes 24x2048 --breakdown --profile 25
    .venv/bin/python bench/plain_pytorch.py --device cpu --sizes gpt2-tiny --steps 2   (smoke test)

What a PyTorch user writes: the model (bench/gpt_port.py, a port of
zero::models::Gpt, parameter count checked against the C++ formula) on the
device in fp32, torch.optim.AdamW(lr 1e-4, weight_decay 0.1, fused=True on
CUDA), bf16 autocast around forward and loss (--dtype fp32: none), backward
outside it, zero_grad(set_to_none=True). --checkpoint: per-block activation
checkpointing (non-reentrant; the C++ model recomputes the same way). Sizes run smallest
first; a device out-of-memory ends the sweep. Step time is the median of
--steps timed steps after --warmup, each ended by a device synchronisation.

--breakdown adds one more set of timed steps with a synchronisation after
forward, after backward and after the optimizer, and reports the median of
each phase (the sum is a little above the step: three syncs instead of one).
--profile N runs one more step under torch.profiler and prints the N device
kernels with the most total time (name, calls, total ms), summed over the
step: what zero-bench fit-plain --profile prints for the C++ loop.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_port import (  # noqa: E402
    VOCAB, build_model_classes, flops_per_token, num_parameters, parse_size, print_results)


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else 0.0


def kernel_table(torch, prof, top):
    """[(name, calls, total device ms)] of the profiled kernels, most time first."""
    rows = {}
    for e in prof.events():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0)
        if not dev_us or e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.startswith(("Optimizer.", "ProfilerStep")):  # user annotations on the GPU timeline, not kernels
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += dev_us / 1e3
    out = sorted(((n, c, ms) for n, (c, ms) in rows.items()), key=lambda x: -x[2])
    return out[:top], sum(ms for _, _, ms in out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--sizes", default="gpt2-tiny,gpt2-small-test")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--checkpoint", action="store_true", help="per-block activation checkpointing")
    ap.add_argument("--breakdown", action="store_true", help="time forward, backward and optimizer apart")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N kernels with the most time")
    ap.add_argument("--matmul-peak", type=float, default=0.0, help="bf16 matmul TFLOP/s, for the MFU column")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.micro_batch <= 0 or a.seq <= 0 or a.steps <= 0 or a.warmup < 0:
        raise SystemExit("--micro-batch, --seq and --steps must be positive, --warmup not negative")

    import torch

    def emit(obj):
        if a.json:
            print(json.dumps(obj), flush=True)

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        msg = f"torch {torch.__version__} sees no CUDA device (run with --device cpu for the smoke test)"
        print("plain_pytorch: " + msg, file=sys.stderr)
        print(json.dumps({"bench": "plain-pytorch", "skipped": msg}))
        return 0
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    Gpt = build_model_classes(torch)
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    optimizer = "torch.optim.AdamW(fused=True)" if cuda else "torch.optim.AdamW"
    print(f"plain_pytorch: torch {torch.__version__} on {device_name}: fp32 params, {optimizer}"
          f"{', bf16 autocast' if a.dtype == 'bf16' else ''}{', activation checkpointing' if a.checkpoint else ''}; "
          f"micro-batch {a.micro_batch}, {a.steps} timed steps (median) after {a.warmup} warmup", flush=True)

    sizes = []
    for s in [x for x in a.sizes.split(",") if x]:
        layers, heads, width, context = parse_size(s, a.seq)
        sizes.append(dict(size=s, layers=layers, width=width, heads=heads, context=context,
                          params=num_parameters(layers, width, context), seq=min(a.seq, context),
                          micro_batch=a.micro_batch))

    results, largest, stop = [], None, False
    for r in sizes:
        if stop:
            r["status"] = "not tried"
            results.append(r)
            continue
        model = opt = None
        try:
            torch.manual_seed(0)
            with torch.device("meta"):
                model = Gpt(r["layers"], r["heads"], r["width"], r["context"])
            model.to_empty(device=device)
            model.init_weights()
            model.checkpoint = a.checkpoint
            counted = sum(p.numel() for p in model.parameters())
            if counted != r["params"]:
                raise SystemExit(f"{r['size']}: the port has {counted} parameters, zero::models::Gpt "
                                 f"{r['params']}: the two models differ")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=cuda)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            seq = r["seq"]

            def batch(s):
                g = torch.Generator().manual_seed(100 + s)
                return torch.randint(VOCAB, (a.micro_batch, seq + 1), generator=g).to(device)

            def step(b, phases=None):
                t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                    loss = model.loss(b[:, :seq], b[:, 1:])
                if phases is not None:
                    sync()
                    t1 = time.perf_counter()
                loss.backward()
                if phases is not None:
                    sync()
                    t2 = time.perf_counter()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync()
                if phases is not None:
                    t3 = time.perf_counter()
                    phases.append((t1 - t0, t2 - t1, t3 - t2))
                return loss

            times = []
            for s in range(a.warmup + a.steps):
                b = batch(s)
                sync()
                t0 = time.perf_counter()
                loss = step(b)
                if s >= a.warmup:
                    times.append(time.perf_counter() - t0)
                if not math.isfinite(loss.item()):
                    raise SystemExit(f"{r['size']}: loss is not finite at step {s}")
            st = median(times)
            tokens = a.micro_batch * seq
            r.update(status="ok", step_ms=st * 1e3, tokens_per_s=tokens / st,
                     tflops=tokens * flops_per_token(r["params"], r["layers"], r["width"], seq) / st / 1e12)
            r["mfu"] = r["tflops"] / a.matmul_peak if a.matmul_peak > 0 else None
            r["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
            if a.breakdown:
                phases = []
                for s in range(a.steps):
                    step(batch(1000 + s), phases)
                r["breakdown_ms"] = {k: 1e3 * median([p[i] for p in phases])
                                     for i, k in enumerate(("forward", "backward", "optimizer"))}
                print(f"  {r['size']}: forward {r['breakdown_ms']['forward']:.1f} ms, backward "
                      f"{r['breakdown_ms']['backward']:.1f} ms, optimizer {r['breakdown_ms']['optimizer']:.1f} ms",
                      flush=True)
            if a.profile > 0 and cuda:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    step(batch(2000))
                top, total = kernel_table(torch, prof, a.profile)
                print(f"  {r['size']}: device kernel time in one step {total:.1f} ms; top {len(top)}:")
                for name, calls, ms in top:
                    print(f"    {ms:9.2f} ms {calls:6d}x  {name[:110]}")
                r["kernels"] = {"total_ms": total, "top": [{"name": n, "calls": c, "ms": ms} for n, c, ms in top]}
            largest = r["size"]
        except torch.OutOfMemoryError as e:
            r["status"], r["error"] = "oom", str(e).splitlines()[0]
            stop = True
        finally:
            del model, opt
            if cuda:
                torch.cuda.empty_cache()
        results.append(r)
        emit(r)
        print(f"  {r['size']:<16} {r['status']}", flush=True)

    print_results(results, largest)
    emit({"bench": "plain-pytorch", "device": a.device, "device_name": device_name, "torch": torch.__version__,
          "optimizer": optimizer, "dtype": a.dtype, "checkpoint": a.checkpoint,
          "matmul_peak_tflops": a.matmul_peak or None, "sizes": results, "largest_fit": largest})
    return 0


if __name__ == "__main__":
    sys.exit(main())
