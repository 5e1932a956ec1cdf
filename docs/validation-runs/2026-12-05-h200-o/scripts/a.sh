#!/usr/bin/env bash
# call A (VARIANTS, NCU: call A2 = VARIANTS="imad_shr=True,lazy_rescale=True" NCU="14 15"): page_tile / imad_shr / lazy / skew timed against the lean default and FlashInfer 0.7.2.post1 (carried in .gpu/fi);
# stall reasons (ncu WarpStateStats) of the default, page_tile and lean+kt+page_tile. carry: [".gpu"]
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=${TMPDIR:-/tmp}/s16; mkdir -p $S/fi $S/dep
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; uname -r
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep:$S/fi
echo "--- t=$((SECONDS-T0)) bench"
timeout 330 python3 benchmarks/bench_attention.py --variants "${VARIANTS:-page_tile=True&imad_shr=False&lazy_rescale=False}" \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $OUT/bench${TAG:-}.json > $OUT/bench${TAG:-}.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4|FlashInfer)" $OUT/bench${TAG:-}.log | cut -c1-70,250-420
echo "--- t=$((SECONDS-T0)) ncu"
for g in ${NCU-0 9 11}; do
  timeout 50 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics regex:smsp__inst_executed_pipe_.*\.sum$,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$ \
    python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon $g > $OUT/ncu-g$g.log 2>&1; echo "ncu g$g rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|inst_executed|stalled" $OUT/ncu-g$g.log | awk '$NF+0 > 0.05 || !/inst_executed|stalled/' | sed 's/  */ /g' | head -45
done
echo "--- t=$((SECONDS-T0))"
