#!/usr/bin/env bash
# call C: bundle parts 2-4, the checkout's plugin (with its matrix), serve mode with the phase split and engine logs
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack --plugin-from-checkout > $OUT/unpack.log 2>&1; echo unpack rc=$?; tail -2 $OUT/unpack.log
S=$PWD/.bundle/site
export PYTHONPATH=$S/plugin:$S/fi-0.6.14:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
left=$(( ${LIMIT:-585} - SECONDS + T0 ))
timeout $left python3 benchmarks/bench_serving.py --modes serve --repeats 1 --timeout $((left/2 - 5)) --log-dir $OUT/engine-logs --json $OUT/serving-serve.json > $OUT/serving-serve.log 2>&1; echo "serve rc=$?"
tail -14 $OUT/serving-serve.log | cut -c1-700
echo "--- t=$((SECONDS-T0))"
