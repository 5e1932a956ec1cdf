#!/usr/bin/env bash
# session 7 (run I), call 2: the rest of the bundle unpacked; validate's recall check (NVFP4, bf16, rotated, fp8,
# FULL; 100 needles a length at 2K/4K/8K) started in the background with a fixed KV reservation (it shares
# the GPU with the GPU prefill-composite tests, FlashInfer 0.6.14 from the bundle, started beside it)
source .gpu/s8/common.sh; LIM=${LIM:-560}
progress
timeout 200 python3 tools/gpu_bundle/run_on_device.py unpack > $S/logs/unpack2.log 2>&1; echo unpack rc=$?; tail -n 3 $S/logs/unpack2.log
prefill_tests_bg; sleep 15; head -3 $S/logs/prefill-tests.log
setsid nohup timeout 1500 python3 tools/gpu_bundle/run_on_device.py run --checks recall --recall-per-depth 10 \
  --recall-beyond "" --kv-cache-gib 8 --budget-s ${BUDGET:-1000} --out $S/validate > $S/logs/validate.log 2>&1 < /dev/null &
echo $! > $S/validate.pid
while [ $(left 9999) -gt 45 ] && { running prefill-tests || running validate; }; do sleep 40; progress; done
grep -E "PASSED|FAILED|ERROR|rotated:|passed|failed" $S/logs/prefill-tests.log | tail -45
tail -n 25 $S/logs/validate.log | cut -c1-250
collect; echo "--- t=$((SECONDS-T0)) end"
