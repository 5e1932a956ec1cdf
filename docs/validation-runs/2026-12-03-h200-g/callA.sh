#!/usr/bin/env bash
# session 5, call A: decode sweep with FlashInfer 0.7.2.post1 in the same run (byte-scale configs), merge knobs,
# rotation bench (fused vs pre/post), ncu shipped vs byte-scale config 0 at 16 x 16K
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=<scratch>/fi-ws PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
SCRATCH=<scratch>; mkdir -p $SCRATCH; source <(sed -n '/^use_fi()/,/^}/p' scripts/gpu/suite.sh); ROOT=$PWD
use_fi 0.7.2.post1 || exit 1
python3 -c "import pydantic, nvfp4compat.plan, triton, torch; print('pydantic', pydantic.__version__, 'triton', triton.__version__, 'torch', torch.__version__)" || exit 1
echo "--- t=$((SECONDS-T0))"
timeout 330 python3 benchmarks/bench_attention.py --shapes decode --json $OUT/bench_decode_sweep.json > $OUT/bench-decode-sweep.log 2>&1; echo rc=$?
grep -E "^\| |^## " $OUT/bench-decode-sweep.log | grep -vE "^\|---" | cut -c1-200 | head -150
echo "--- t=$((SECONDS-T0))"
timeout 70 python3 benchmarks/bench_attention.py --no-flashinfer --no-sweep --shapes "decode 1 x 8K,decode ragged 8" --knob FUSED_MERGE=1 --knob MERGE_STEP_ELEMENTS=2048 --json $OUT/bench_merge_knobs.json > $OUT/bench-merge-knobs.log 2>&1; echo rc=$?
grep -E "^\| triton|^## " $OUT/bench-merge-knobs.log | cut -c1-200
echo "--- t=$((SECONDS-T0))"
timeout 130 python3 benchmarks/bench_rotation.py --json $OUT/bench_rotation.json > $OUT/bench-rotation.log 2>&1; echo rc=$?
grep -E "^\| " $OUT/bench-rotation.log | cut -c1-230
echo "--- t=$((SECONDS-T0))"
for v in default bytes0; do
  extra=""; [ $v = bytes0 ] && extra="--byte-scales 0"
  timeout 45 ncu --clock-control none --kernel-name regex:"_decode_kernel" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" $extra > $OUT/ncu-16x16K-$v.log 2>&1; echo ncu $v rc=$?
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Grid Size|Block Size|Shared Memory Configuration Size|Dynamic Shared" $OUT/ncu-16x16K-$v.log | head -12
done
echo "--- t=$((SECONDS-T0))"
