#!/usr/bin/env python3
"""PyTorch FSDP2 with CPUOffloadPolicy training zerocpp's GPT: issue 6's peer (c).

    python3 bench/fsdp2_offload.py --device cuda --sizes gpt2,gpt2-xl,32x2560 [--json]
    .venv/bin/python bench/fsdp2_offload.py --device cpu --sizes gpt2-tiny --steps 2   (smoke test)

One process, world size 1 (torch.distributed over a file:// store in a
temporary directory: no port, no launcher). Each block and then the whole
model are wrapped with `fully_shard(offload_policy=CPUOffloadPolicy(),
mp_policy=MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32))`:
fp32 sharded parameters, their gradients and torch.optim.AdamW's moments live
in host memory and AdamW steps there; forward and backward run in bf16 on the
device. The model is a port of zero::models::Gpt (include/zero/models/gpt.h):
same modules, shapes, order, initialisation and loss, byte vocabulary of 256,
tied head; its parameter count is checked against the C++ formula
(GptConfig::num_parameters) before anything runs. Sizes and FLOPs are those of
`zero-bench fit-plain`: a preset or LxD[xH], sequence min(--seq, context),
FLOPs per token 6 * params + 6 * layers * seq * width (GptConfig::flops_per_token).

On a machine without CUDA it runs the same code with gloo on the CPU, where
CPUOffloadPolicy has nothing to offload: a smoke test of this script, not a
peer figure (the JSON says "smoke": true).

Sizes run smallest first; a device out-of-memory ends the sweep. A size whose
host-side state (16 bytes per parameter: fp32 params, grads, two moments)
would not fit in 90% of MemAvailable is reported as "host memory" without
being run, since the kernel's OOM killer, not an exception, would end it.

With --json: one JSON line per size as it finishes, then one object of all.
"""
import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_port import (  # noqa: E402
    VOCAB, build_model_classes, flops_per_token,
    host_available_bytes, num_parameters, parse_size, print_results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--sizes", default="gpt2-tiny,gpt2-small-test")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--checkpoint", action="store_true", help="per-block activation checkpointing")
    ap.add_argument("--matmul-peak", type=float, default=0.0,
                    help="bf16 matmul TFLOP/s measured on this device (zero-bench fit-plain), for the MFU column")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    def emit(obj):
        if a.json:
            print(json.dumps(obj), flush=True)

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        msg = ("FSDP2 CPUOffloadPolicy is a GPU peer and needs CUDA: torch " + torch.__version__ +
               " sees no CUDA device (run with --device cpu for the CPU smoke test)")
        print("fsdp2_offload: " + msg, file=sys.stderr)
        print(json.dumps({"bench": "fsdp2-offload", "skipped": msg}))
        return 0

    sizes = []
    for s in [x for x in a.sizes.split(",") if x]:
        layers, heads, width, context = parse_size(s, a.seq)
        sizes.append(dict(size=s, layers=layers, width=width, heads=heads, context=context,
                          params=num_parameters(layers, width, context), seq=min(a.seq, context)))

    tmp = tempfile.mkdtemp(prefix="fsdp2_offload.")
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method="file://" + os.path.join(tmp, "store"), rank=0, world_size=1)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (1,))
    Gpt = build_model_classes(torch)
    # Pinned host memory needs CUDA; on the CPU there is nothing to pin.
    offload = CPUOffloadPolicy(pin_memory=cuda)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"fsdp2_offload: torch {torch.__version__} on {device_name}: FSDP2 fully_shard, CPUOffloadPolicy"
          f"(pin_memory={cuda}), bf16 params/fp32 reduce, torch.optim.AdamW on the host; micro-batch "
          f"{a.micro_batch}, {a.steps} timed steps (median) after {a.warmup} warmup" +
          ("" if cuda else " [CPU smoke test: nothing is offloaded]"), flush=True)

    results, largest, stop = [], None, False
    for r in sizes:
        r["micro_batch"] = a.micro_batch
        if stop:
            r["status"] = "not tried"
            results.append(r)
            continue
        need, avail = 16 * r["params"], host_available_bytes()
        if avail is not None and need > 0.9 * avail:
            r["status"] = "host memory"
            r["error"] = f"needs ~{need / 2**30:.1f} GiB of host memory, {avail / 2**30:.1f} GiB available"
            stop = True
            results.append(r)
            emit(r)
            continue
        model = opt = None
        try:
            torch.manual_seed(0)
            # Built on the meta device and materialised once on the host: no default init to redo.
            with torch.device("meta"):
                model = Gpt(r["layers"], r["heads"], r["width"], r["context"])
            model.to_empty(device="cpu")
            model.init_weights()
            model.checkpoint = a.checkpoint
            counted = sum(p.numel() for p in model.parameters())
            if counted != r["params"]:
                raise SystemExit(f"{r['size']}: the port has {counted} parameters, zero::models::Gpt "
                                 f"{r['params']}: the two models differ")
            for b in model.h:
                fully_shard(b, mesh=mesh, offload_policy=offload, mp_policy=mp)
            fully_shard(model, mesh=mesh, offload_policy=offload, mp_policy=mp)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            times, seq = [], r["seq"]
            for s in range(a.warmup + a.steps):
                g = torch.Generator().manual_seed(100 + s)
                b = torch.randint(VOCAB, (a.micro_batch, seq + 1), generator=g).to(device)
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = model.loss(b[:, :seq], b[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad()
                if cuda:
                    torch.cuda.synchronize()
                if s >= a.warmup:
                    times.append(time.perf_counter() - t0)
                if not math.isfinite(loss.item()):
                    raise SystemExit(f"{r['size']}: loss is not finite at step {s}")
            step = sorted(times)[len(times) // 2]
            tokens = a.micro_batch * seq
            r.update(status="ok", step_ms=step * 1e3, tokens_per_s=tokens / step,
                     tflops=tokens * flops_per_token(r["params"], r["layers"], r["width"], seq) / step / 1e12)
            r["mfu"] = r["tflops"] / a.matmul_peak if a.matmul_peak > 0 else None
            r["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
            r["host_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
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
    emit({"bench": "fsdp2-offload", "device": a.device, "device_name": device_name, "torch": torch.__version__,
          "smoke": not cuda, "optimizer": "torch.optim.AdamW (host)",
          "precision": "fp32 sharded params on host, bf16 compute, fp32 reduce",
          "matmul_peak_tflops": a.matmul_peak or None, "sizes": results, "largest_fit": largest})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
