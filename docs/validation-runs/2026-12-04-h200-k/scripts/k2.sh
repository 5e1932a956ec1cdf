#!/usr/bin/env bash
source .gpu/s11/common.sh
setup
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import flashinfer, torch, triton, tvm_ffi; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
echo "[$((SECONDS-T0))] smoke"; timeout 100 python3 $ROOT/.gpu/s11/smoke.py 2>&1 | tee $S/logs/smoke2.log | tail -14
echo "[$((SECONDS-T0))] bench"
timeout 330 python3 benchmarks/bench_attention.py --variants gluon \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_k2.json > $S/logs/bench-k2.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4 \| (default|gluon)|flashinfer)" $S/logs/bench-k2.log | sed -E 's/DecodeConfig\(block_n=([0-9]+), num_warps=([0-9]+), num_stages=([0-9]), maxnreg=([A-Za-z0-9]+),[^)]*\)/\1\/\2\/\3\/\4/' | cut -c1-150
collect
echo "[$((SECONDS-T0))] done"
