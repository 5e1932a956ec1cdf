#!/usr/bin/env bash
# stop 50 bundle calls (vLLM 0.26.0 + FlashInfer 0.6.14, tools/gpu_bundle):
#   PART=1: carry [".bundle/p01", ".bundle/manifest.json"]                           -> unpack only
#   PART=2: carry [".bundle/p02", ".bundle/manifest.json"]                           -> unpack only
#   PART=3: carry [".bundle/p03", ".bundle/p04", ".bundle/manifest.json"]            -> unpack with the checkout's
#           plugin, then MODE=serve: bench_serving.py --modes serve (1K + 7K, the model) or MODE=check6:
#           validate --checks throughput
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt
timeout 120 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok --plugin-from-checkout > $OUT/unpack${PART:-3}.log 2>&1
echo "unpack rc=$?"; tail -3 $OUT/unpack${PART:-3}.log
[ "${PART:-3}" = 3 ] || exit 0
left=$(( ${LIMIT:-585} - SECONDS + T0 ))
if [ "${MODE:-serve}" = check6 ]; then
  timeout $left python3 tools/gpu_bundle/run_on_device.py run --checks throughput --budget-s $(( left - 15 )) \
    --plugin-from-checkout --out $OUT/check6 > $OUT/validate.log 2>&1; echo "check 6 rc=$?"; tail -14 $OUT/validate.log | cut -c1-400
else
  S=$PWD/.bundle/site
  PYTHONPATH=$S/plugin:$S/fi-0.6.14:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PATH=/usr/local/cuda/bin:$PATH \
  CUDA_HOME=/usr/local/cuda timeout $left python3 benchmarks/bench_serving.py --modes serve --repeats 1 \
    --context 1024 --new-tokens 7168 --warmup-new-tokens 64 \
    --timeout ${ENGINE_S:-$((left/2 - 5))} --log-dir $OUT/engine-logs --json $OUT/serving-serve.json > $OUT/serving-serve.log 2>&1
  echo "serve rc=$?"; tail -8 $OUT/serving-serve.log | cut -c1-400
fi
echo "--- t=$((SECONDS-T0))"
