#!/usr/bin/env bash
# call 1: decode/prefill experiments (no FlashInfer), GPU tests, sanitizer, ncu
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
SCRATCH=<scratch>; mkdir -p $SCRATCH; python3 -m pip install -q --no-index --no-deps --target $SCRATCH/dep .gpu/pydantic*.whl .gpu/annotated*.whl .gpu/typing_insp*.whl
export PYTHONPATH=$PWD:$SCRATCH/dep
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
OUTJ=$OUT/exp1.json timeout 260 python3 .gpu/exp1.py decode,prefill,mixed 2>&1 | grep -v Warn | tee $OUT/exp1.log
echo "--- t=$((SECONDS-T0))"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_bad_metadata.py -x > $OUT/gpu-bad-metadata.log 2>&1; tail -2 $OUT/gpu-bad-metadata.log
echo "--- t=$((SECONDS-T0))"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py --ops decode,prefill > $OUT/memcheck.log 2>&1; echo memcheck rc=$?; grep -E "ERROR SUMMARY|cases" $OUT/memcheck.log | tail -3
echo "--- t=$((SECONDS-T0))"
left=$((540-SECONDS+T0)); [ $left -gt 40 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_attention.py -k "not flashinfer" > $OUT/gpu-attention-tests.log 2>&1; tail -3 $OUT/gpu-attention-tests.log
echo "--- t=$((SECONDS-T0))"
