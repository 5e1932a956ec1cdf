#!/usr/bin/env bash
# next session, call B (any card): the rest of shard 3 of the GPU attention suite on the spread default (305 ids run Z
# did not reach)
export OUT=$OUT/o; mkdir -p $OUT
LIST=${LIST:-.gpu/s50/shard3-rest.txt} N=12 LIMIT=${LIMIT:-540} RERUN_S=90 bash scripts/gpu/suite.sh shard
