#!/usr/bin/env bash
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.fi-ws PYTHONUNBUFFERED=1
T0=$SECONDS
SCRATCH=<scratch>; mkdir -p $SCRATCH; source <(sed -n '/^use_fi()/,/^}/p' scripts/gpu/suite.sh); ROOT=$PWD; use_fi 0.7.2.post1
timeout 60 ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" > $OUT/ncu-16x16K.log 2>&1
grep -E "Registers|Achieved Occ|Theoretical Occ|DRAM Through|Duration|Waves" $OUT/ncu-16x16K.log | head -12
echo "--- t=$((SECONDS-T0))"
timeout 330 python3 benchmarks/bench_attention.py --no-sweep --shapes decode,prefill,mixed --baseline .gpu/att_head.py --json $OUT/bench_fi.json > $OUT/bench-fi.log 2>&1; echo rc=$?
grep -E "^\| (triton|Flash)|^## " $OUT/bench-fi.log | cut -c1-170 | head -90
echo "--- t=$((SECONDS-T0))"
left=$((560-SECONDS+T0)); [ $left -gt 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_attention.py -k "not flashinfer" -x > $OUT/gpu-attention-tests.log 2>&1; tail -3 $OUT/gpu-attention-tests.log
echo "--- t=$((SECONDS-T0))"
