#!/usr/bin/env bash
# stop 50 call A: the Gluon fused merge (FUSED_MERGE in the Gluon decode) on the GPU: its tests; then the six
# decode shapes + three short ones with the spread default against the spread off and the fused merge, FlashInfer
# 0.7.2.post1 in the same run
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt; uname -r >> $OUT/card.txt
MATCH="fused_merge" MEMCHECK_MATCH= TESTS_S=${TESTS_S:-170} N=8 TAG=a bash scripts/gpu/suite.sh config
KNOBS="--knob SPLIT_SPREAD_PROGRAMS_PER_SM=0 --knob FUSED_MERGE=1" VARIANTS="" NCU="" LIMIT=${LIMIT:-330} TAG=a \
SHAPES="decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
SPECS="decode 1 x 1K;decode 1 x 2K;decode ragged 4 x 0.2K-3K" \
  bash scripts/gpu/suite.sh variants
