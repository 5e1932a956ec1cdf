#!/usr/bin/env bash
# session 5, call B: bundle part 1 unpacked (pydantic from it; for call C's recall), rotation bench with the
# Triton readers (no FlashInfer on the path: fused vs pre/post vs plain), compute-sanitizer memcheck (all ops,
# incl. rotation / byte-scale / fused-merge cases) and racecheck (decode, prefill)
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
timeout 120 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -n 2 $OUT/unpack1.log
D=<scratch>/dep; mkdir -p $D
for m in pydantic pydantic_core annotated_types; do ln -sfn $PWD/.bundle/site/common/$m $D/$m; done
python3 -m pip install -q --no-index --no-deps --target $D .gpu/typing_inspection*.whl 2>&1 | tail -n 1
export PYTHONPATH=$PWD:$D
python3 -c "import pydantic, nvfp4compat.plan, triton; print('pydantic', pydantic.__version__, 'triton', triton.__version__)" || exit 1
echo "--- t=$((SECONDS-T0))"
timeout 120 python3 benchmarks/bench_rotation.py --json $OUT/bench_rotation.json > $OUT/bench-rotation.log 2>&1; echo rc=$?
grep -E "^\| " $OUT/bench-rotation.log | cut -c1-230
echo "--- t=$((SECONDS-T0))"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 210 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py > $OUT/memcheck.log 2>&1; echo memcheck rc=$?; grep -E "ERROR SUMMARY|cases|^FAIL|^bad" $OUT/memcheck.log | tail -n 4
echo "--- t=$((SECONDS-T0))"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize.py --ops decode,prefill > $OUT/racecheck.log 2>&1; echo racecheck rc=$?; grep -E "RACECHECK SUMMARY|cases" $OUT/racecheck.log | tail -n 2
echo "--- t=$((SECONDS-T0))"
