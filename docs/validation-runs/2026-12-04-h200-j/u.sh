#!/usr/bin/env bash
# run J: unpack the bundle parts carried so far (the benchmark job runs on beside it)
source .gpu/s10/common.sh; LIM=${LIM:-120}
timeout $(left 110) python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $S/logs/unpack-$(date +%s).log 2>&1; echo unpack rc=$?
tail -n 3 $(ls -t $S/logs/unpack-*.log | head -1)
progress; echo "--- t=$((SECONDS-T0)) end"
