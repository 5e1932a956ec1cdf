#!/usr/bin/env bash
# next session, call A (any card): the Gluon fused merge after 26904cf (empty requests' chunks, the capture stream's
# spare counters): its GPU tests, memcheck of its sanitizer cases, then timed against the default with FlashInfer in
# the same run (the graph now holds the fused merge); then the rest of shard 3 (305 ids) with the time left
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/card.txt; uname -r >> $OUT/card.txt
MATCH="fused_merge" MEMCHECK_MATCH="fused merge" TESTS_S=${TESTS_S:-150} MEMCHECK_S=60 N=8 TAG=d bash scripts/gpu/suite.sh config
KNOBS="--knob FUSED_MERGE=1" VARIANTS="" NCU="" LIMIT=${LIMIT:-300} TAG=d \
SHAPES="decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
SPECS="decode 1 x 1K;decode 1 x 2K;decode 1 x 0.5K;decode ragged 4 x 0.2K-3K" \
  bash scripts/gpu/suite.sh variants
