#!/usr/bin/env bash
# Device call 2 (carry .bundle/p02 .bundle/p03): finish the unpack, then start check 2 (CUDA-graph
# modes), check 5 (FlashInfer 0.6.15) and, once the training of call 1 is done, the recall check, as
# three runners side by side. Each engine reserves a fixed KV budget (--kv-cache-gib) so that no
# runner's memory profiling counts another's allocations; no check run here measures memory or
# speed. The runners are their own process sessions and outlive this call; 03-collect.sh gathers them.
set -u
cd "$(dirname "$0")/../../.."
R="python3 scripts/gpu_bundle/run_on_device.py"
mkdir -p /tmp/dev
$R unpack || exit 3
bg() {  # bg NAME ARGS...: one runner in its own session; its exit code lands in /tmp/dev/NAME.rc
  local name=$1; shift
  setsid nohup bash -c "$*; echo \$? > /tmp/dev/$name.rc" > /tmp/dev/$name.log 2>&1 </dev/null &
}
common="--kv-cache-gib 4 --budget-s 1500 --job-timeout 600"
bg c2 "$R run --checks 2 $common --work /tmp/w-c2 --out /tmp/o-c2"
sleep 3
bg c5 "$R run --checks 5 $common --work /tmp/w-c5 --out /tmp/o-c5"
bg rc "while [ ! -f /tmp/dev/train.rc ]; do sleep 5; done; cat /tmp/dev/train.rc; \
  $R run --checks recall --recall-model /tmp/recall-model $common --work /tmp/w-rc --out /tmp/o-rc"
sleep "${WAIT_S:-480}"
for n in train c2 c5 rc; do echo "== $n rc=$(cat /tmp/dev/$n.rc 2>/dev/null || echo running)"; tail -n 6 /tmp/dev/$n.log; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
