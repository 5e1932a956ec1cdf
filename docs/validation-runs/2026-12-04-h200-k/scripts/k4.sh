#!/usr/bin/env bash
source .gpu/s11/common.sh
setup
echo "[$((SECONDS-T0))] pytest gluon (background) + memcheck"
( timeout 250 python3 -m pytest -q -m gpu tests/kernels/test_gpu_decode_gluon.py tests/kernels/test_gpu_attention.py -k "gluon or (decode and not flashinfer)" -p no:cacheprovider > $S/logs/pytest-gluon.log 2>&1; echo "pytest rc=$?" >> $S/logs/pytest-gluon.log ) &
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
  python3 scripts/sanitize.py --ops decode --dtype bf16 > $S/logs/memcheck-gluon.log 2>&1; echo "memcheck rc=$?"
tail -4 $S/logs/memcheck-gluon.log
wait
tail -8 $S/logs/pytest-gluon.log
collect
echo "[$((SECONDS-T0))] done"
