#!/usr/bin/env bash
# Device call 3: the recall GPU tier (pytest, torch over the project's paged kernels) while the
# runners finish; then check 6 (throughput) alone on the GPU with --save-caches; everything packed
# into $OUT (at most 8 files).
set -u
cd "$(dirname "$0")/../../.."
R="python3 scripts/gpu_bundle/run_on_device.py"
T0=$(date +%s); LIMIT=${LIMIT_S:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
pack() {  # pack NAME DIR: DIR as $OUT/NAME.tar.xz
  [ -d "$2" ] && tar -C "$(dirname "$2")" -cJf "$OUT/$1.tar.xz" "$(basename "$2")" && ls -la "$OUT/$1.tar.xz"
}
if [ -f /tmp/recall-model/model.safetensors ] && [ ! -f /tmp/dev/gpu-tier.rc ]; then
  mkdir -p tests/data/recall-model && cp /tmp/recall-model/* tests/data/recall-model/
  PYTHONPATH=$PWD:/tmp/site/fi-0.7.2.post1:/tmp/site/common timeout $(( $(left) - 200 )) \
    python3 -m pytest -q -m gpu tests/test_gpu_recall.py -s -p no:cacheprovider > /tmp/dev/gpu-tier.log 2>&1
  echo $? > /tmp/dev/gpu-tier.rc; tail -n 30 /tmp/dev/gpu-tier.log
fi
while [ $(left) -gt 260 ] && { [ ! -f /tmp/dev/c2.rc ] || [ ! -f /tmp/dev/c5.rc ] || [ ! -f /tmp/dev/rc.rc ]; }; do sleep 10; done
for n in train c2 c5 rc; do echo "== $n rc=$(cat /tmp/dev/$n.rc 2>/dev/null || echo running)"; tail -n 12 /tmp/dev/$n.log; done
if [ -f /tmp/dev/c2.rc ] && [ -f /tmp/dev/c5.rc ] && [ -f /tmp/dev/rc.rc ] && [ ! -f /tmp/dev/c6.rc ]; then
  $R run --checks 6 --budget-s $(( $(left) - 60 )) --job-timeout 300 --work /tmp/w-c6 --out /tmp/o-c6 --save-caches
  echo $? > /tmp/dev/c6.rc
  mv /tmp/o-c6/caches.tar.xz.* "$OUT"/ 2>/dev/null
fi
cp /tmp/dev/*.log /tmp/dev/*.rc /tmp/o-rc/ 2>/dev/null || cp /tmp/dev/*.log /tmp/dev/*.rc /tmp/o-c2/ 2>/dev/null
for n in c2 c5 rc c6; do pack $n /tmp/o-$n; done
[ -f /tmp/recall-model/model.safetensors ] && tar -C /tmp -cf "$OUT/recall-model.tar" recall-model && ls -la "$OUT"
