#!/usr/bin/env bash
# session 7 (run I), call 3: wait for the background jobs; collect their logs
source .gpu/s8/common.sh; LIM=${LIM:-560}
progress
while [ $(left 9999) -gt 30 ] && { running prefill-tests || running validate; }; do sleep 30; progress; done
grep -E "PASSED|FAILED|ERROR|rotated:|passed|failed" $S/logs/prefill-tests.log | tail -45
tail -n 40 $S/logs/validate.log | cut -c1-250
collect; echo "--- t=$((SECONDS-T0)) end"
