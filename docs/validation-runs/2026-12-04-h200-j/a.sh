#!/usr/bin/env bash
# run J, call 1: start the decode benchmark job in its own session (it outlives the call)
source .gpu/s10/common.sh; LIM=${LIM:-60}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r; nproc
setsid nohup bash .gpu/s10/${JOB:-bench}.sh > $S/logs/bench-job.log 2>&1 < /dev/null &
echo $! > $S/bench.pid
sleep ${WAIT:-40}; cat $S/logs/bench-job.log; progress
echo "--- t=$((SECONDS-T0)) end"
