#!/usr/bin/env bash
# The offline bundle (tools/gpu_bundle/README.md) on a GPU host, one transfer per device call: the parts do not fit
# one call's carry beside the checkout, so they come over several calls on one warm machine (its unpacked site stays
# between calls; a fresh machine starts over at PART=1). `python3 tools/gpu_bundle/build.py plan` prints which parts go
# in which transfer; carry those folders and .bundle/manifest.json with each call.
#   PART=1, PART=2 ...  unpack the parts this call carried (--partial-ok)
#   PART=last           unpack the rest, put this checkout's nvfp4compat/ and matrix/ in place of the bundle's plugin
#                       (--plugin-from-checkout), then run MODE within LIMIT s (default 585):
#     MODE=serve        benchmarks/bench_serving.py --modes serve: the 16-layer random-weight model at a KV budget that
#                       holds N bf16 requests of 8K tokens (1K prompt + 7K new), 4N requests with bf16 and with NVFP4
#                       (issue #14's serve proof: NVFP4 >= 2.5x bf16), engine logs under OUT/engine-logs
#     MODE=check6       nvfp4compat validate's check 6 (decode throughput of bf16 and NVFP4 at vLLM's default graph
#                       settings) through tools/gpu_bundle/run_on_device.py run --checks 6
# FLASHINFER: the bundled FlashInfer release the jobs import (default 0.6.14, vLLM 0.26.0's pin). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-${TMPDIR:-/tmp}/nvfp4compat-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
T0=$SECONDS
FI=${FLASHINFER:-0.6.14}
left() { echo $(( ${LIMIT:-585} - SECONDS + T0 - ${1:-0} )); }
case ${PART:-} in
  last)
    timeout "$(left 60)" python3 tools/gpu_bundle/run_on_device.py unpack --plugin-from-checkout >"$OUT/unpack-last.log" 2>&1
    echo "unpack (last) rc=$?"; tail -n 3 "$OUT/unpack-last.log"
    S=$PWD/.bundle/site
    case ${MODE:-serve} in
      serve)
        export PYTHONPATH=$S/plugin:$S/fi-$FI:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
        export PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
        t=$(left 5)
        timeout "$t" python3 benchmarks/bench_serving.py --modes serve --context 1024 --new-tokens 7168 \
          --warmup-new-tokens 64 --repeats 1 --timeout $(( t / 2 - 5 )) --log-dir "$OUT/engine-logs" \
          --json "$OUT/serving-serve.json" >"$OUT/serving-serve.log" 2>&1
        echo "serve rc=$?"; tail -n 14 "$OUT/serving-serve.log" | cut -c1-700 ;;
      check6)
        timeout "$(left 5)" python3 tools/gpu_bundle/run_on_device.py run --checks 6 --flashinfer "$FI" \
          --plugin-from-checkout --budget-s "$(left 15)" --out "$OUT/check6" >"$OUT/check6.log" 2>&1
        echo "check6 rc=$?"; tail -n 20 "$OUT/check6.log" | cut -c1-700
        [ -f "$OUT/check6/summary.md" ] && cat "$OUT/check6/summary.md" ;;
      *) echo "unknown MODE ${MODE:-} (serve or check6)"; exit 2 ;;
    esac ;;
  [1-9]|[1-9][0-9])
    timeout "$(left 5)" python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok >"$OUT/unpack-$PART.log" 2>&1
    echo "unpack $PART rc=$?"; tail -n 3 "$OUT/unpack-$PART.log" ;;
  *) echo "PART=${PART:-} (need 1, 2, ... for the first transfers, last for the final one)"; exit 2 ;;
esac
python3 tools/gpu_bundle/run_on_device.py status 2>&1 | tail -n 4
echo "--- t=$(( SECONDS - T0 )) s"
