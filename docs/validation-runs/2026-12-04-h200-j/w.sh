#!/usr/bin/env bash
# run J: wait for the background jobs (up to LIM s), report, bring back the logs
source .gpu/s10/common.sh; LIM=${LIM:-560}
progress
while [ $(left 9999) -gt 30 ] && { running bench || running validate; }; do sleep 30; progress; done
cat $S/logs/bench-job.log | tail -n 20
tail -n 30 $S/logs/validate.log | cut -c1-250
collect; echo "--- t=$((SECONDS-T0)) end"
