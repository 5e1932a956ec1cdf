#!/usr/bin/env bash
source .gpu/s12/common.sh
setup
echo "[$((SECONDS-T0))] gluon: varlen rows of prefill batches, the widened default envelope"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py -k "prefill_batches or is_the_default" > $S/logs/pytest-gluon3.log 2>&1; echo "rc=$?"
grep -E "passed|failed|^FAILED|^ERROR|Error" $S/logs/pytest-gluon3.log | cut -c1-250 | tail -25
echo "[$((SECONDS-T0))] bench: the other decode shapes, default only"
timeout $(( $(left) - 10 )) python3 benchmarks/bench_attention.py --no-sweep \
  --shapes "decode 64 x 8K,decode 48 x 4K,decode ragged 40" --json $S/out/bench_l3.json > $S/logs/bench-l3.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton|FlashInfer)" $S/logs/bench-l3.log | cut -c1-60,100-260
collect
echo "[$((SECONDS-T0))] done"
