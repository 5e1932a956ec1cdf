#!/usr/bin/env bash
# Device call 1 of a side-by-side session (carry .bundle/p01): unpack the first part and start the
# recall-model training (issue 7) in its own process session, so it runs on through later calls.
# Needs only the host's torch/safetensors/tokenizers and the working tree.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/dev
echo "uid $(id -u), $(nproc) cpus"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 scripts/gpu_bundle/run_on_device.py unpack --partial-ok
if [ ! -f /tmp/dev/train.rc ] && ! pgrep -f train_recall_model.py >/dev/null; then
  setsid nohup bash -c "PYTHONUNBUFFERED=1 python3 scripts/train_recall_model.py --out /tmp/recall-model \
    --device cuda --max-seconds ${TRAIN_SECONDS:-360} > /tmp/dev/train.log 2>&1; echo \$? > /tmp/dev/train.rc" \
    >/dev/null 2>&1 </dev/null &
fi
sleep "${SETTLE:-25}"
tail -n 8 /tmp/dev/train.log
