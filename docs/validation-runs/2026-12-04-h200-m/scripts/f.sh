#!/usr/bin/env bash
# call F (session 11): bundle part 1, the checkout's plugin code (with its matrix), serve mode with the phase split
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack > $OUT/unpack2.log 2>&1; echo unpack rc=$?; tail -1 $OUT/unpack2.log
S=$PWD/.bundle/site
rm -rf $S/plugin/nvfp4compat && cp -r nvfp4compat $S/plugin/ && cp -r matrix $S/plugin/nvfp4compat/matrix
export PYTHONPATH=$S/plugin:$S/fi-0.6.14:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
left=$(( ${LIMIT:-585} - SECONDS + T0 ))
timeout $left python3 benchmarks/bench_serving.py --modes serve --repeats 1 --timeout $((left/2 - 5)) --log-dir $OUT/engine-logs --json $OUT/serving-serve.json > $OUT/serving-serve.log 2>&1; echo "serve rc=$?"
tail -12 $OUT/serving-serve.log | cut -c1-600
grep -h "Running:" $OUT/engine-logs/*.log | cut -c1-250 | tail -30
echo "--- t=$((SECONDS-T0))"
