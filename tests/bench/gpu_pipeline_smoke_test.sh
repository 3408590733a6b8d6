#!/usr/bin/env bash
# bench/gpu's benchmark parts on the CPU at gpt2-tiny, written under the
# names bench/gpu gives them, then bench/gpu_report.py over them: the
# pipeline's plumbing (flags, JSON lines, the merge, the skip of the GPU-only
# peer), never its timings.
set -euo pipefail
root=$1 python=$2 bench=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
st=smoke
tiny=(--sizes gpt2-tiny --seq 32 --micro-batch 2 --steps 1 --warmup 1 --json)
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bench" fit-plain --device cpu --optimizer torch --matmul 64 --breakdown "${tiny[@]}" >"$dir/cpp-torch-adamw-$st.log"
"$bench" fit-plain --device cpu --optimizer fused --matmul none --breakdown "${tiny[@]}" >"$dir/cpp-fused-adamw-$st.log"
"$python" "$root/bench/plain_pytorch.py" --device cpu --breakdown "${tiny[@]}" >"$dir/python-plain-$st.log"
"$python" "$root/bench/plain_pytorch.py" --device cpu --checkpoint "${tiny[@]}" >"$dir/python-plain-ckpt-$st.log"
"$python" "$root/bench/deepspeed_offload.py" "${tiny[@]}" >"$dir/deepspeed-offload-$st.log" 2>/dev/null
"$python" "$root/bench/fsdp2_offload.py" --device cpu --checkpoint "${tiny[@]}" >"$dir/fsdp2-offload-$st.log"
# The zero optimizer needs CUDA: a clear error, no log.
if "$bench" fit-plain --device cpu --optimizer zero "${tiny[@]}" 2>"$dir/err"; then fail "--optimizer zero ran on the CPU"; fi
grep -q "needs --device cuda" "$dir/err" || fail "--optimizer zero on the CPU: $(cat "$dir/err")"

out=$("$python" "$root/bench/gpu_report.py" --dir "$dir" --stamp "$st" --out "$dir/gpu.json")
echo "$out"
for want in "C++ at::_fused_adamw_" "C++ torch::optim::AdamW" "PyTorch AdamW(fused=True)" \
            "cpp-fused-adamw: largest that fits: gpt2-tiny" "python-plain-ckpt: largest that fits: gpt2-tiny" \
            "deepspeed-offload: skipped" "fsdp2-offload: largest that fits: gpt2-tiny" \
            "cpp-zero-adam: skipped: no output"; do
  grep -qF -- "$want" <<<"$out" || fail "report lacks '$want'"
done
"$python" - "$dir/gpu.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["parts"]
for name in ("cpp-torch-adamw", "cpp-fused-adamw", "python-plain"):
    r = p[name]["sizes"][0]
    assert r["status"] == "ok" and r["params"] == 120576, (name, r)
    assert set(r["breakdown_ms"]) == {"forward", "backward", "optimizer"}, (name, r)
assert p["python-plain-ckpt"]["summary"]["checkpoint"] is True
assert p["deepspeed-offload"]["skipped"]
PY

# The timeline part: the engine with offload + DPU traced, drawn as SVG.
"$bench" fit-plain --device cpu --dtype fp32 --optimizer engine --stage 2 --offload cpu --dpu --cpu-threads 1 \
  --timeline "$dir/timeline" --matmul none "${tiny[@]}" >"$dir/timeline.log"
"$python" "$root/bench/timeline_svg.py" "$dir/timeline-gpt2-tiny.json" --out "$dir/timeline.svg"
"$python" - "$dir/timeline-gpt2-tiny.json" "$dir/timeline.svg" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
lanes = {i["lane"] for i in j["intervals"]}
assert {"compute", "cpu step", "host wait"} <= lanes, lanes
assert j["dpu"] is True and len(j["steps_ms"]) == 2, j
svg = open(sys.argv[2]).read()
assert svg.startswith("<svg") and svg.count("<rect") > len(j["intervals"]), svg[:200]
PY
# Stage 3 with the parameter partition and the optimizer offloaded, built on
# meta, traced (on the CPU the gathers run on the compute stream: no lane).
"$bench" fit-plain --device cpu --dtype fp32 --optimizer engine --stage 3 --offload cpu --dpu --offload-param \
  --cpu-threads 1 --timeline "$dir/s3" --matmul none "${tiny[@]}" >"$dir/cpp-engine-stage3-param-$st.log"
"$python" - "$dir/s3-gpt2-tiny.json" "$dir/cpp-engine-stage3-param-$st.log" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["stage"] == 3 and j["offload_param"] is True and j["dpu"] is True, j
sizes = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{") and '"sizes"' in l][0]["sizes"]
assert sizes[0]["status"] == "ok" and sizes[0]["params"] == 120576, sizes
PY
# Twin-Flow: 70% of the optimizer state on the CPU, the rest stepped where
# the model is, traced (its lane: "device step").
"$bench" fit-plain --device cpu --dtype fp32 --optimizer engine --stage 2 --offload cpu --dpu --offload-ratio 0.7 \
  --cpu-threads 1 --timeline "$dir/share" --matmul none "${tiny[@]}" >"$dir/cpp-engine-offload-share-$st.log"
"$python" - "$dir/share-gpt2-tiny.json" "$dir/cpp-engine-offload-share-$st.log" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["offload_ratio"] == 0.7 and j["dpu"] is True, j
lanes = {i["lane"] for i in j["intervals"]}
assert {"cpu step", "device step"} <= lanes, lanes
sizes = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{") and '"sizes"' in l][0]["sizes"]
assert sizes[0]["status"] == "ok", sizes
PY
out=$("$python" "$root/bench/gpu_report.py" --dir "$dir" --stamp "$st" --out "$dir/gpu.json")
grep -qF "zerocpp Z3 + offload_param + DPU" <<<"$out" || fail "the report lacks the stage-3 row"
grep -qF "ratio<1" <<<"$out" || fail "the report lacks the Twin-Flow row"
if "$bench" fit-plain --device cpu --optimizer engine --offload-ratio 0.5 "${tiny[@]}" 2>"$dir/err"; then
  fail "--offload-ratio without --offload cpu ran"
fi
grep -q "needs --optimizer engine --offload cpu" "$dir/err" || fail "--offload-ratio refusal: $(cat "$dir/err")"
if "$bench" fit-plain --device cpu --optimizer engine --offload-param "${tiny[@]}" 2>"$dir/err"; then
  fail "--offload-param without --stage 3 ran"
fi
grep -q "add --stage 3" "$dir/err" || fail "--offload-param refusal: $(cat "$dir/err")"
if "$bench" fit-plain --device cpu --optimizer torch --timeline "$dir/x" "${tiny[@]}" 2>"$dir/err"; then
  fail "--timeline without --optimizer engine ran"
fi
grep -q "configure --optimizer engine" "$dir/err" || fail "--timeline refusal: $(cat "$dir/err")"
echo "gpu pipeline smoke: ok"
