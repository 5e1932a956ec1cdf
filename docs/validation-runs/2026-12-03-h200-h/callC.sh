#!/usr/bin/env bash
# session 6, call C: the rest of the bundle unpacked; validate check 8 (recall) at 10 needles a depth (100 a
# length) at 2K/4K/8K: NVFP4 (plan: Triton write/decode, dequant_fa3 prefill), bf16, rotated NVFP4, then fp8
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack > $OUT/unpack2.log 2>&1; echo unpack rc=$?; tail -n 3 $OUT/unpack2.log
echo "--- t=$((SECONDS-T0))"
left=$((585-SECONDS+T0))
timeout $left python3 tools/gpu_bundle/run_on_device.py run --checks recall --recall-per-depth 10 --recall-beyond "" --budget-s $((left-20)) --out $OUT/validate > $OUT/validate.log 2>&1; echo validate rc=$?
tail -n 40 $OUT/validate.log | cut -c1-250
echo "--- t=$((SECONDS-T0))"
