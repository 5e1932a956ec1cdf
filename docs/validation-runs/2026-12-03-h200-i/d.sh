#!/usr/bin/env bash
# session 7 (run I), call 5: the rest of the rebuilt bundle unpacked; in the background, side by side: the four GPU
# prefill-composite tests that failed in call 2 (after the fixes), and validate's rotated recall job alone
# (--jobs '*-rot-*'; the rotated plan now binds dequant_fa3 with its fused rotation)
source .gpu/s8/common.sh; LIM=${LIM:-470}
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack > $S/logs/unpack4.log 2>&1; echo unpack rc=$?; tail -n 2 $S/logs/unpack4.log
( B=$PWD/.bundle/site; export PYTHONPATH=$PWD:$B/fi-0.6.14:$B/common
  setsid nohup timeout 900 python3 -m pytest -q -m gpu -rA -s -p no:cacheprovider \
    "$F::test_rotated_cache_fused_rotation" "$F::test_features_match_reference[dequant_fa2-False-window]" \
    "$F::test_features_match_reference[dequant_fa2-False-all-tensor-scales]" \
    "$F::test_features_match_reference[dequant_fa3-False-window]" > $S/logs/prefill-tests-2.log 2>&1 < /dev/null &
  echo $! > $S/prefill-tests.pid )
setsid nohup timeout 900 python3 tools/gpu_bundle/run_on_device.py run --checks recall --jobs '*-rot-*' --recall-per-depth 10 \
  --recall-beyond "" --kv-cache-gib 8 --out $S/validate-rot > $S/logs/validate-rot.log 2>&1 < /dev/null &
echo $! > $S/validate.pid
while [ $(left 9999) -gt 25 ] && { running prefill-tests || running validate; }; do sleep 20; progress; done
grep -E "PASSED|FAILED|ERROR|rotated|passed|failed|skipped" $S/logs/prefill-tests-2.log | tail -20
tail -n 14 $S/logs/validate-rot.log | cut -c1-250
mkdir -p $S/validate; cp -r $S/validate-rot $S/validate/ 2>/dev/null; collect; echo "--- t=$((SECONDS-T0)) end"
