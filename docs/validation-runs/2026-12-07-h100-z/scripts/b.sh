#!/usr/bin/env bash
# stop 50 call B: the quick list of the GPU suite on the spread default (97 ids), then memcheck of the fused merge
export OUT=$OUT/o; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
LIST=${LIST:-.gpu/s49/list-d.txt} N=12 LIMIT=${LIMIT:-470} RERUN_S=60 bash scripts/gpu/suite.sh shard
S=${TMPDIR:-/tmp}
[ -d "$S/dep/pydantic" ] || python3 -m pip install -q --no-index --no-deps --target "$S/dep" .gpu/*.whl
PYTHONPATH=$PWD:$S/dep PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${MC_S:-90} compute-sanitizer --tool memcheck \
  --error-exitcode 3 python3 scripts/sanitize.py --device cuda --ops decode --dtype bf16 --match "fused merge" \
  > $OUT/memcheck-b.log 2>&1; echo "memcheck rc $?"
tail -3 $OUT/memcheck-b.log
