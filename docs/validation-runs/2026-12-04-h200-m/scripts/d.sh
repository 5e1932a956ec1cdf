#!/usr/bin/env bash
# call D: the checkout's plugin code with its matrix in the unpacked bundle; check 6's NVFP4 jobs (bf16 ran in call B), then serve
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
S=$PWD/.bundle/site
[ -d $S/common/vllm ] || { echo "bundle not unpacked"; exit 3; }
rm -rf $S/plugin/nvfp4compat && cp -r nvfp4compat $S/plugin/ && cp -r matrix $S/plugin/nvfp4compat/matrix && ls $S/plugin/nvfp4compat/matrix | head -3
timeout 200 python3 tools/gpu_bundle/run_on_device.py run --checks throughput --jobs "nvfp4-*" --budget-s 180 --out $OUT/validate > $OUT/validate.log 2>&1; echo validate rc=$?
grep -E "^\[|  nvfp4|PASS|FAIL|tok/s" $OUT/validate.log | cut -c1-200 | tail -12
echo "--- t=$((SECONDS-T0))"
export PYTHONPATH=$S/plugin:$S/fi-0.6.14:$S/common VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
left=$(( ${LIMIT:-585} - SECONDS + T0 ))
timeout $left python3 benchmarks/bench_serving.py --modes serve --repeats 1 --timeout $((left/2 - 5)) --json $OUT/serving-serve.json > $OUT/serving-serve.log 2>&1; echo "serve rc=$?"
tail -12 $OUT/serving-serve.log | cut -c1-400
echo "--- t=$((SECONDS-T0))"
