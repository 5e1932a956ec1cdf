#!/usr/bin/env bash
# Device call 4 (and 5): wait for the recall runner of 11-bench-recall.sh; then, alone on the GPU and
# with enough time left, check 6 (throughput, with the FULL-decode opt-in engine); pack everything into
# $OUT (at most 8 files). Run again in a next call while something is still running.
set -u
cd "$(dirname "$0")/../../.."
R="python3 scripts/gpu_bundle/run_on_device.py"
T0=$(date +%s); LIMIT=${LIMIT_S:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
while [ $(left) -gt 30 ] && [ ! -f /tmp/dev/rc.rc ]; do sleep 10; done
echo "== recall rc=$(cat /tmp/dev/rc.rc 2>/dev/null || echo running)"; tail -n 12 /tmp/dev/rc.log
if [ -f /tmp/dev/rc.rc ] && [ ! -f /tmp/dev/c6.rc ] && [ $(left) -gt ${C6_MIN_S:-330} ]; then
  $R run --checks 6 --budget-s $(( $(left) - 40 )) --job-timeout 300 --work /tmp/w-c6 --out /tmp/o-c6
  echo $? > /tmp/dev/c6.rc
fi
tar -C /tmp/dev -cJf "$OUT/dev-logs.tar.xz" . 2>/dev/null
for n in rc c6; do [ -d /tmp/o-$n ] && tar -C /tmp -cJf "$OUT/o-$n.tar.xz" "o-$n"; done
ls -la "$OUT"
