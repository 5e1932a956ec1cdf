#!/usr/bin/env bash
# run J, last call: once check 4 is done, the decode benchmark again with the new head_dim-128 default (byte scales,
# 168-register cap, merge steps of 2048) against the shipped ac2d392 kernel (--baseline) and FlashInfer in one run,
# then the GPU decode tests
source .gpu/s10/common.sh; LIM=${LIM:-580}
progress
while [ $(left 9999) -gt 330 ] && running validate; do sleep 15; done; progress
if running validate; then echo "validate still running: stopped (its process group) so that the benchmark has the GPU alone"; kill -- -$(cat $S/validate.pid); sleep 5; fi
R=$S/repo2; rm -rf $R; mkdir -p $R; tar --exclude=./.bundle --exclude=./.gpu -cf - . | tar -xf - -C $R; cp .gpu/att_baseline.py $S/att_baseline.py
cd $R; export PYTHONPATH=$R:$S/dep:$S/fi
timeout $(left 200) python3 benchmarks/bench_attention.py --no-sweep --baseline $S/att_baseline.py \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_decode_new.json > $S/logs/bench-decode-new.log 2>&1; echo "bench rc=$? t=$((SECONDS-T0))"
grep -E "^\| (triton|FlashInfer)|^## " $S/logs/bench-decode-new.log | cut -c1-200
timeout $(left 150) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_attention.py -k "decode and not flashinfer" \
  > $S/logs/gpu-decode-tests.log 2>&1; echo "tests rc=$? t=$((SECONDS-T0))"; tail -n 5 $S/logs/gpu-decode-tests.log
cd - > /dev/null; tail -n 12 $S/logs/validate.log | cut -c1-250
collect; echo "--- t=$((SECONDS-T0)) end"
