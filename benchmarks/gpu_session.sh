#!/usr/bin/env bash
# One lease of a GPU machine (the device tool): correctness on CUDA first, then the timings, each step under
# its own time cap so that the whole run ends inside one 10-minute command and every log comes back.
#   run from the project root there:  OUT=<folder> TOOLS=<copy of the shared GPU tools> bash benchmarks/gpu_session.sh
# Logs and JSON go to $OUT (8 files: what one call brings back); the last lines printed are the summary.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-out}; TOOLS=${TOOLS:-.tools}; END=${END:-560}
mkdir -p "$OUT"
step() {  # step NAME CAP_SECONDS COMMAND...: run under min(CAP, time left), log to $OUT/NAME.log
  local name=$1 cap=$2; shift 2
  local left=$((END - SECONDS)); ((cap > left)) && cap=$left
  if ((cap < 15)); then echo "SKIP $name (no time left)" | tee -a "$OUT/summary.txt"; return; fi
  local t0=$SECONDS
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s (cap ${cap}s)" | tee -a "$OUT/summary.txt"
}
{ date -u; nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"; git log --oneline -1; } > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
# 1. top-k inputs on CUDA (never run there before), the Jaccard kernel, the plan rules
step tests_topk 130 python3 -m pytest -q -n 8 -p no:cacheprovider -rf tests/test_topk_devices.py \
    tests/test_topk_entry_points.py tests/test_node_sets.py tests/test_jaccard_triton.py tests/test_plan.py
# 2. every decoder at B = 4,096 and 40,737 on both bundled trees (checks before timings)
step bench 190 python3 -m benchmarks.run --device cuda --trees tiered,inat --cuda-batch-sizes 4096,40737 \
    --python-baseline-samples 0 --baseline-samples 50 --no-backend-compare --min-time 0.2 --repeats 3 \
    --json "$OUT/bench-cuda.json"
# 3. serving batches (B = 1 to 4,096): public decode, validate=False, DecodingHead eager and CUDA graph
step latency 60 python3 "$TOOLS/latency.py"
# 4. top-k against dense on the GPU
step topk 60 python3 -m benchmarks.topk --device cuda --trees tieredimagenet-h inat19 100k --rows 1024 --ks 10 100 \
    --repeats 3
# 5. the Lightning callback on the GPU (7 metrics x 7 decoders, 40,737 rows)
step lightning 80 python3 "$TOOLS/lightning_cost.py"
# 6. the rest of the suite on CUDA with the time left (-v: the failures are in the log even if it is cut)
step suite 600 python3 -m pytest -v -n 12 -p no:cacheprovider -m "not slow" tests --deselect tests/test_topk_devices.py
# the suite's verdict (its last line, or the count so far if it was cut) and its failures, into the summary
{ echo "suite: $(tail -1 "$OUT/suite.log")"; echo "suite so far: $(grep -c " PASSED " "$OUT/suite.log") passed"
  grep -E "^(FAILED|ERROR) " "$OUT/suite.log" | sed 's/ - .*//' | sort | uniq -c | head -40; } >> "$OUT/summary.txt"
tail -3 "$OUT/tests_topk.log"; grep -E "Checks:|FAIL" "$OUT/bench.log" | head; tail -25 "$OUT/latency.log"; tail -8 "$OUT/lightning.log"
grep -c " yes |" "$OUT/topk.log"; grep " NO |" "$OUT/topk.log" | head; cat "$OUT/summary.txt"
