#!/usr/bin/env bash
# call B: bundle part 1 (complete), the plugin's code replaced by this checkout's, check 6 (throughput)
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
timeout 150 python3 tools/gpu_bundle/run_on_device.py unpack > $OUT/unpack2.log 2>&1; echo unpack rc=$?; tail -3 $OUT/unpack2.log
rm -rf .bundle/site/plugin/nvfp4compat && cp -r nvfp4compat .bundle/site/plugin/ && echo "plugin code: checkout $(git rev-parse --short HEAD 2>/dev/null) + working tree"
echo "--- t=$((SECONDS-T0))"
left=$(( ${LIMIT:-590} - SECONDS + T0 ))
timeout $left python3 tools/gpu_bundle/run_on_device.py run --checks throughput --budget-s $((left - 20)) --out $OUT/validate > $OUT/validate.log 2>&1; echo validate rc=$?
tail -30 $OUT/validate.log | cut -c1-250
echo "--- t=$((SECONDS-T0))"
