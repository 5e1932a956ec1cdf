#!/usr/bin/env bash
# call B (s20), the bundle in three calls (a call's tree + carry must stay under 64 MiB):
#   PART=1: carry [".bundle/p01", ".bundle/manifest.json"]            -> unpack only
#   PART=2: carry [".bundle/p02", ".bundle/manifest.json"]            -> unpack only
#   PART=3: carry [".bundle/p03", ".bundle/p04", ".bundle/plugin-wheel", ".bundle/manifest.json"]
#           -> unpack with the checkout's plugin, then check 6 (validate --checks throughput) with MERGE_PDL as
#              shipped (off), then, with the time left, serve (8K + 256).
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack --plugin-from-checkout > $OUT/unpack${PART:-3}.log 2>&1
echo "unpack rc=$?"; tail -2 $OUT/unpack${PART:-3}.log
[ "${PART:-3}" = 3 ] || exit 0
if [ "${CHECK6:-430}" != 0 ]; then
timeout ${CHECK6:-430} python3 tools/gpu_bundle/run_on_device.py run --checks throughput --budget-s $(( ${CHECK6:-430} - 10 )) \
  --plugin-from-checkout > $OUT/validate.log 2>&1; echo "check 6 rc=$?"; tail -12 $OUT/validate.log | cut -c1-300
fi
left=$(( ${LIMIT:-585} - SECONDS + T0 ))
if [ $left -gt 300 ]; then
  S=$PWD/.bundle/site
  PYTHONPATH=$S/plugin:$S/fi-0.6.14:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PATH=/usr/local/cuda/bin:$PATH \
  CUDA_HOME=/usr/local/cuda timeout $left python3 benchmarks/bench_serving.py --modes serve --repeats 1 ${SERVE_ARGS:-} \
    --timeout ${ENGINE_S:-$((left/2 - 5))} --log-dir $OUT/engine-logs --json $OUT/serving-serve.json > $OUT/serving-serve.log 2>&1
  echo "serve rc=$?"; tail -6 $OUT/serving-serve.log | cut -c1-400
fi
echo "--- t=$((SECONDS-T0))"
