#!/usr/bin/env bash
source .gpu/s11/common.sh
setup
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import flashinfer, torch, triton, tvm_ffi; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'tvm_ffi', tvm_ffi.__version__)"
echo "[$((SECONDS-T0))] smoke"; true || timeout 60 python3 $ROOT/.gpu/s11/smoke.py 2>&1 | tee $S/logs/smoke3.log | tail -3
echo "[$((SECONDS-T0))] bench"
timeout 380 python3 benchmarks/bench_attention.py --variants "block_n=128, num_warps=4, num_stages=2, maxnreg=168,gluon DecodeConfig(block_n=32" \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_k3.json > $S/logs/bench-k3.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4 \| (default|gluon|byte)|flashinfer)" $S/logs/bench-k3.log | sed -E 's/DecodeConfig\(block_n=([0-9]+), num_warps=([0-9]+), num_stages=([0-9]), maxnreg=([A-Za-z0-9]+),[^)]*\)/\1\/\2\/\3\/\4/' | cut -c1-140
echo "[$((SECONDS-T0))] ncu"
[ -n "${NCU:-}" ] && timeout $((540 - (SECONDS - T0))) ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats -k regex:gluon_decode \
  python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --iters 2 > $S/logs/ncu-16x16K-gluon.log 2>&1; echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Warp Cycles Per Issued|Stall" $S/logs/ncu-16x16K-gluon.log | head -20
collect
echo "[$((SECONDS-T0))] done"
