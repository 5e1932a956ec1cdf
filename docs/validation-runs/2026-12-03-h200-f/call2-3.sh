#!/usr/bin/env bash
# session 4, call D: the whole bundle unpacked; validate check 6 (throughput) at vLLM's default graph settings
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 200 python3 tools/gpu_bundle/run_on_device.py unpack > $OUT/unpack2.log 2>&1; echo unpack rc=$?; tail -3 $OUT/unpack2.log
echo "--- t=$((SECONDS-T0))"
left=$((575-SECONDS+T0))
timeout $left python3 tools/gpu_bundle/run_on_device.py run --checks throughput --budget-s $((left-25)) --out $OUT/validate > $OUT/validate.log 2>&1; echo validate rc=$?
tail -25 $OUT/validate.log | cut -c1-250
echo "--- t=$((SECONDS-T0))"
