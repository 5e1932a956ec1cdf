#!/usr/bin/env bash
# call A (any card): BATCH_BLOCK_TINY=32 and the one-warp configs #16/#17 on short and issue shapes, with FlashInfer in
# the same run; the GPU tests of stop 51 (blocks of 32, the fused merge's new bound, CUDA graphs); ncu at 1 x 1K
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt; uname -r >> $OUT/card.txt
KNOBS="--knob BATCH_BLOCK_TINY=32" VARIANTS="#16:,#17:" NCU="" LIMIT=${LIMIT:-270} TAG=a \
SHAPES="decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
SPECS="decode 1 x 1K;decode 1 x 2K;decode 1 x 0.5K;decode ragged 4 x 0.2K-3K;decode 2 x 4K;decode ragged 32 x 0.1K-16K" \
  bash scripts/gpu/suite.sh variants
MATCH="blocks_of_32 or fused_merge or cuda_graph" MEMCHECK_MATCH="" TESTS_S=${TESTS_S:-150} N=8 TAG=a \
  bash scripts/gpu/suite.sh config
for k in 128 32; do
  timeout 45 ncu --cache-control none --clock-control none --kernel-name regex:'gluon_decode|reduce|merge' \
    --launch-skip 6 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
    python3 benchmarks/profile_attention.py --shape "decode 1 x 1K" --knob BATCH_BLOCK_TINY=$k > $OUT/ncu-1x1K-tiny$k.log 2>&1
  echo "ncu tiny=$k rc=$?"; grep -E "gluon_decode|merge|reduce|Duration|inst_executed|Issued Ipc|Warp Cycles Per Issued" $OUT/ncu-1x1K-tiny$k.log | head -20
done
