#!/usr/bin/env bash
# session 7 (run I), call 1: the bundle's first part unpacked; a background probe (does a process in its own
# session outlive the call?)
source .gpu/s8/common.sh; LIM=120
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r; nproc
setsid nohup bash -c 'while true; do date +%s > <scratch>/alive; sleep 2; done' > /dev/null 2>&1 < /dev/null &
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $S/logs/unpack1.log 2>&1; echo unpack rc=$?; tail -n 3 $S/logs/unpack1.log
echo "--- t=$((SECONDS-T0)) end"
