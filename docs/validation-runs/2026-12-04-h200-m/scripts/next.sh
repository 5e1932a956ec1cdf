#!/usr/bin/env bash
# next session, one call: the transposed-logits variant (kt_logits) on the GPU, then timed against the default
source .gpu/s12/common.sh
setup
echo "[$((SECONDS-T0))] gluon tests, kt"
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py -k "kt" > $S/logs/pytest-kt.log 2>&1; echo "rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $S/logs/pytest-kt.log | cut -c1-220 | tail -20
echo "[$((SECONDS-T0))] bench"
timeout $(( $(left) - 60 )) python3 benchmarks/bench_attention.py --variants "kt_logits=True" \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_kt.json > $S/logs/bench-kt.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4|FlashInfer)" $S/logs/bench-kt.log | cut -c1-60,250-420
echo "[$((SECONDS-T0))] ncu kt"
timeout 50 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
  python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon 4 > $S/logs/ncu-kt.log 2>&1; echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Warp|stalled" $S/logs/ncu-kt.log | awk '$NF+0 > 0.05 || !/stalled/' | head -20
collect
