#!/usr/bin/env bash
# session 5, call C: the whole bundle unpacked; validate check 8 (recall) with today's plan (prefill dequant_fa3
# binding, rotated job), 5 needles a depth
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack > $OUT/unpack2.log 2>&1; echo unpack rc=$?; tail -n 3 $OUT/unpack2.log
echo "--- t=$((SECONDS-T0))"
left=$((580-SECONDS+T0))
timeout $left python3 tools/gpu_bundle/run_on_device.py run --checks recall --recall-per-depth 5 --budget-s $((left-25)) --out $OUT/validate > $OUT/validate.log 2>&1; echo validate rc=$?
tail -n 30 $OUT/validate.log | cut -c1-250
echo "--- t=$((SECONDS-T0))"
