#!/usr/bin/env bash
# one call (any card): the chunk table (knob DECODE_TABLE_MIN_BATCH=1) and smem_merge (config #53) against the default,
# FlashInfer in the same run, on large batches of short requests, short requests, three issue shapes and head_dim 64 /
# 256; then the GPU tests of smem_merge, the table and the plan; memcheck of the plan, the table and smem_merge
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt; uname -r >> $OUT/card.txt
KNOBS="--knob DECODE_TABLE_MIN_BATCH=1" VARIANTS="#53:" NCU="" LIMIT=${LIMIT:-330} TAG=c \
SHAPES="decode 16 x 16K,decode 128 x 2K,decode 1 x 8K" \
SPECS="decode 1024 x 0.25K;decode 256 x 1K;decode 512 x 0.5K;decode 1 x 0.5K;decode 1 x 1K;decode 1 x 2K;decode ragged 4 x 0.2K-3K;decode 32 x 4K hd 64;decode 16 x 8K hd 256" \
  bash scripts/gpu/suite.sh variants 2>&1 | grep -E "^decode|\| decode|rc=|Error|error" | cut -c1-120
MATCH="smem or chunk_table or merge_plan" MEMCHECK_MATCH="" TESTS_S=${TESTS_S:-150} N=8 TAG=c \
  bash scripts/gpu/suite.sh config 2>&1 | grep -E "passed|failed|error|rc=" | tail -6
( mkdir -p $TMPDIR/dep2; pip install -q --no-deps --target $TMPDIR/dep2 .gpu/*.whl >/dev/null 2>&1
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD:$TMPDIR/dep2 timeout ${MC_S:-60} compute-sanitizer --tool memcheck \
    --error-exitcode 3 python3 scripts/sanitize.py --device cuda --ops decode --dtype bf16 --knob MERGE_PLAN_MIN_BATCH=1 \
    --knob DECODE_TABLE_MIN_BATCH=1 --match "smem merge" > $OUT/memcheck.log 2>&1
  echo "memcheck rc=$?"; tail -3 $OUT/memcheck.log )
