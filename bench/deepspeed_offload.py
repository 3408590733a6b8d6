#!/usr/bin/env python3
"""DeepSpeed ZeRO-2 + CPU optimizer offload training zerocpp's GPT: the ZeRO-Offload peer.

    python3 bench/deepspeed_offload.py --sizes 24x2048,32x2560 --micro-batch 8 [--json]
    python3 bench/deepspeed_offload.py --config bench/deepspeed_zero2_offload.json ...

One process, world size 1, no launcher (the rendezvous variables are set
here). The model (bench/gpt_port.py, a port of zero::models::Gpt, parameter
count checked against the C++ formula) is built on the GPU in fp32 and handed
to deepspeed.initialize with the JSON config (default
bench/deepspeed_zero2_offload.json: bf16, clipping 1.0, AdamW lr 1e-4 wd 0.1
on the CPU (DeepSpeedCPUAdam), ZeRO-2 with offload_optimizer cpu,
pin_memory, overlap_comm, contiguous_gradients, 2e8 reduce buckets);
--micro-batch overrides the config's train_micro_batch_size_per_gpu. Its CPU
Adam op builds just in time on the first size (about a minute; cached in
TORCH_EXTENSIONS_DIR). Sizes run smallest first; a device out-of-memory ends
the sweep, and a size whose host state (DeepSpeed holds ~27.4 bytes per
parameter there, docs/PERFORMANCE.md) would not fit in 90% (--host-fraction) of MemAvailable is
reported as "host memory" without being run. Step time: median of --steps
after --warmup, each ended by a device synchronisation; host memory: the
process's peak resident set (ru_maxrss) after the size.

Without CUDA it prints a JSON line saying it was skipped and exits 0.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from gpt_port import (  # noqa: E402
    VOCAB, build_model_classes, flops_per_token, host_available_bytes, num_parameters, parse_size)

HOST_BYTES_PER_PARAM = 27.4  # DeepSpeed ZeRO-2 + offload_optimizer, measured (docs/PERFORMANCE.md)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="24x2048")
    ap.add_argument("--config", default=os.path.join(here, "deepspeed_zero2_offload.json"))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--checkpoint", action="store_true", help="per-block activation checkpointing")
    ap.add_argument("--matmul-peak", type=float, default=0.0, help="bf16 matmul TFLOP/s, for the MFU column")
    ap.add_argument("--host-fraction", type=float, default=0.9,
                    help="run a size only when ~27.4 B/param fits in this fraction of MemAvailable (4.54B needs "
                         "1.0 on a 125 GiB host, where issue 18 ran it at 115.6 GiB)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    def emit(obj):
        if a.json:
            print(json.dumps(obj), flush=True)

    if not torch.cuda.is_available():
        msg = f"DeepSpeed ZeRO-Offload is a GPU peer: torch {torch.__version__} sees no CUDA device"
        print("deepspeed_offload: " + msg, file=sys.stderr)
        print(json.dumps({"bench": "deepspeed-offload", "skipped": msg}))
        return 0
    try:
        import deepspeed
    except ImportError as e:
        msg = (f"cannot import deepspeed ({e}): on an offline GPU machine bench/gpu installs it from the "
               "bundle that bench/gpu-bundle writes; elsewhere: pip install deepspeed")
        print("deepspeed_offload: " + msg, file=sys.stderr)
        print(json.dumps({"bench": "deepspeed-offload", "skipped": msg}))
        return 0
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29561"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                 ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    with open(a.config) as f:
        config = json.load(f)
    config["train_micro_batch_size_per_gpu"] = a.micro_batch
    config["train_batch_size"] = a.micro_batch * config.get("gradient_accumulation_steps", 1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    device_name = torch.cuda.get_device_name(device)
    Gpt = build_model_classes(torch)
    print(f"deepspeed_offload: deepspeed {deepspeed.__version__}, torch {torch.__version__} on {device_name}: "
          f"{os.path.basename(a.config)} (ZeRO-{config['zero_optimization']['stage']}, offload_optimizer "
          f"{config['zero_optimization'].get('offload_optimizer', {}).get('device', 'none')}); micro-batch "
          f"{a.micro_batch}{', activation checkpointing' if a.checkpoint else ''}, {a.steps} timed steps (median) "
          f"after {a.warmup} warmup", flush=True)

    results, largest, stop = [], None, False
    for s in [x for x in a.sizes.split(",") if x]:
        layers, heads, width, context = parse_size(s, a.seq)
        r = dict(size=s, layers=layers, width=width, heads=heads, context=context,
                 params=num_parameters(layers, width, context), seq=min(a.seq, context), micro_batch=a.micro_batch)
        if stop:
            r["status"] = "not tried"
            results.append(r)
            continue
        need, avail = HOST_BYTES_PER_PARAM * r["params"], host_available_bytes()
        if avail is not None and need > a.host_fraction * avail:
            r["status"] = "host memory"
            r["error"] = f"needs ~{need / 2**30:.1f} GiB of host memory, {avail / 2**30:.1f} GiB available"
            stop = True
            results.append(r)
            emit(r)
            continue
        engine = model = None
        try:
            torch.manual_seed(0)
            with torch.device("meta"):
                model = Gpt(layers, heads, width, context)
            model.to_empty(device=device)
            model.init_weights()
            model.checkpoint = a.checkpoint
            counted = sum(p.numel() for p in model.parameters())
            if counted != r["params"]:
                raise SystemExit(f"{s}: the port has {counted} parameters, zero::models::Gpt {r['params']}")
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            torch.cuda.reset_peak_memory_stats(device)
            seq, times = r["seq"], []
            for i in range(a.warmup + a.steps):
                g = torch.Generator().manual_seed(100 + i)
                b = torch.randint(VOCAB, (a.micro_batch, seq + 1), generator=g).to(device)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = engine.module.loss(b[:, :seq], b[:, 1:])
                engine.backward(loss)
                engine.step()
                torch.cuda.synchronize()
                if i >= a.warmup:
                    times.append(time.perf_counter() - t0)
                if not math.isfinite(loss.item()):
                    raise SystemExit(f"{s}: loss is not finite at step {i}")
            st = sorted(times)[len(times) // 2]
            tokens = a.micro_batch * seq
            r.update(status="ok", step_ms=st * 1e3, mean_step_ms=1e3 * sum(times) / len(times),
                     tokens_per_s=tokens / st,
                     tflops=tokens * flops_per_token(r["params"], layers, width, seq) / st / 1e12,
                     peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30,
                     host_peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30)
            r["mfu"] = r["tflops"] / a.matmul_peak if a.matmul_peak > 0 else None
            largest = s
        except torch.OutOfMemoryError as e:
            r["status"], r["error"] = "oom", str(e).splitlines()[0]
            stop = True
        finally:
            del engine, model
            torch.cuda.empty_cache()
        results.append(r)
        emit(r)
        print(f"  {s:<16} {r['status']}", flush=True)

    print(f"{'size':<16} {'params M':>9} {'status':>11} {'step ms':>10} {'TFLOP/s':>8} {'GPU GiB':>8} {'host GiB':>9}")
    for r in results:
        line = f"{r['size']:<16} {r['params'] / 1e6:9.1f} {r['status']:>11}"
        if r["status"] == "ok":
            line += f" {r['step_ms']:10.1f} {r['tflops']:8.2f} {r['peak_mem_gib']:8.2f} {r['host_peak_rss_gib']:9.2f}"
        print(line)
    print(f"largest that fits: {largest or 'none'}")
    emit({"bench": "deepspeed-offload", "device": "cuda", "device_name": device_name, "torch": torch.__version__,
          "deepspeed": deepspeed.__version__, "config": config, "checkpoint": a.checkpoint,
          "matmul_peak_tflops": a.matmul_peak or None, "sizes": results, "largest_fit": largest})
    return 0


if __name__ == "__main__":
    sys.exit(main())
