#!/usr/bin/env bash
source .gpu/s12/common.sh
setup
echo "[$((SECONDS-T0))] gluon tests (not the reference cases of call 1)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py -k "not matches_reference" > $S/logs/pytest-gluon2.log 2>&1; echo "rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $S/logs/pytest-gluon2.log | cut -c1-220 | tail -25
echo "[$((SECONDS-T0))] ncu stalls, default (E4M3 conversion), 16 x 16K"
timeout 120 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
  python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --iters 3 > $S/logs/ncu-16x16K-cvt8.log 2>&1; echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|stalled" $S/logs/ncu-16x16K-cvt8.log | awk '$NF+0 > 0.05 || !/stalled/' | head -40
echo "[$((SECONDS-T0))] memcheck decode (bf16: the Gluon default)"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py --ops decode --dtype bf16 > $S/logs/memcheck-decode.log 2>&1; echo "memcheck rc=$?"
tail -4 $S/logs/memcheck-decode.log
collect
echo "[$((SECONDS-T0))] done"
