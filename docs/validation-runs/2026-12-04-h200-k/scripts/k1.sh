#!/usr/bin/env bash
source .gpu/s11/common.sh
setup
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
echo "[$((SECONDS-T0))] smoke"; timeout 150 python3 $ROOT/.gpu/s11/smoke.py 2>&1 | tee $S/logs/smoke.log | tail -20
echo "[$((SECONDS-T0))] bench"
timeout 240 python3 benchmarks/bench_attention.py --no-flashinfer --variants gluon \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_k1.json > $S/logs/bench-k1.log 2>&1; echo "bench rc=$?"
grep -E "^\|" $S/logs/bench-k1.log | head -60
echo "[$((SECONDS-T0))] pytest"
timeout $((560 - (SECONDS - T0))) python3 -m pytest -q -x -m gpu tests/kernels/test_gpu_decode_gluon.py -p no:cacheprovider > $S/logs/pytest-gluon.log 2>&1; echo "pytest rc=$?"
tail -30 $S/logs/pytest-gluon.log
collect
echo "[$((SECONDS-T0))] done"
