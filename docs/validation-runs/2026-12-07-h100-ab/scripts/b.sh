#!/usr/bin/env bash
# call B: the merge plan (MERGE_PLAN_MIN_BATCH, default 33) and blocks of 32 as the default: GPU tests, then timed
# against the scan (MERGE_PLAN_MIN_BATCH=1000000), the plan everywhere (=1) and smaller big-batch blocks, with
# FlashInfer in the same run, on the issue shapes and large batches of short requests
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt; uname -r >> $OUT/card.txt
MATCH="merge_plan or blocks_of_32" MEMCHECK_MATCH="" TESTS_S=${TESTS_S:-120} N=8 TAG=b bash scripts/gpu/suite.sh config 2>&1 | grep -E "passed|failed|error|rc=" | tail -5
KNOBS="--knob MERGE_PLAN_MIN_BATCH=1,1000000 --knob BATCH_BLOCK_MAX=128,256" VARIANTS="" NCU="" LIMIT=${LIMIT:-420} TAG=b \
SHAPES="decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K" \
SPECS="decode 256 x 1K;decode 512 x 0.5K;decode 1024 x 0.25K;decode ragged 256 x 0.1K-4K;decode 64 x 1K;decode 1 x 1K" \
  bash scripts/gpu/suite.sh variants 2>&1 | grep -E "^decode|rc=|Error|error" | cut -c1-110
