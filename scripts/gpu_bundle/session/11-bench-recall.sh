#!/usr/bin/env bash
# Device call 3 of a single-GPU session (carry .bundle/p03 .bundle/p04, after two `unpack --partial-ok`
# calls for p01 and p02): complete the unpack; the codec benchmarks alone on the GPU (FlashInfer
# 0.7.2.post1 side by side); then the vLLM recall runner in its own process session (it outlives this
# call; 12-collect.sh gathers it) and, beside it, the GPU tier of the recall model and of the codec
# (neither measures speed; the runner's engines reserve a fixed KV budget with --kv-cache-gib).
set -u
cd "$(dirname "$0")/../../.."
R="python3 scripts/gpu_bundle/run_on_device.py"
export PYTHONUNBUFFERED=1
FI_PATH="$PWD:/tmp/site/fi-0.7.2.post1:/tmp/site/common"
mkdir -p /tmp/dev
$R unpack || exit 3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
if [ ! -f /tmp/dev/bench.rc ]; then
  for b in append dequant; do
    echo "=== bench_$b"
    PYTHONPATH=$FI_PATH timeout 200 python3 benchmarks/bench_$b.py > /tmp/dev/bench-$b.log 2>&1
    echo "rc=$?" >> /tmp/dev/bench-$b.log; cat /tmp/dev/bench-$b.log | grep -v "^\s*$" | tail -n 40
  done
  echo done > /tmp/dev/bench.rc
fi
if [ ! -f /tmp/dev/rc.rc ] && ! pgrep -f "checks recall" >/dev/null; then
  setsid nohup bash -c "$R run --checks recall --recall-model tests/data/recall-model --kv-cache-gib 4 \
    --budget-s ${RECALL_BUDGET_S:-1100} --job-timeout 600 --work /tmp/w-rc --out /tmp/o-rc; echo \$? > /tmp/dev/rc.rc" \
    > /tmp/dev/rc.log 2>&1 </dev/null &
fi
sleep 5
PYTHONPATH=$FI_PATH timeout ${TIER_S:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -s \
  tests/test_gpu_recall.py tests/kernels/test_gpu_codec.py > /tmp/dev/gpu-tier.log 2>&1
echo "gpu tier rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|recall" /tmp/dev/gpu-tier.log | tail -n 40
echo "== recall runner"; tail -n 8 /tmp/dev/rc.log
