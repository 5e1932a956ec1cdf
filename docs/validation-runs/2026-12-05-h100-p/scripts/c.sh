#!/usr/bin/env bash
# call C: the GPU tests of configs CFGS (.gpu/s18/ids-N.txt; default "28 31"), then memcheck of the new paths' sanitizer
# cases (MATCH). carry: [".gpu"]
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
S=${TMPDIR:-/tmp}/s18; mkdir -p $S/dep
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep
ids=""; for c in ${CFGS-28 31}; do ids="$ids $(cat .gpu/s18/ids-$c.txt)"; done
timeout ${PYT:-330} python3 -m pytest -p no:cacheprovider -rf -q $ids > $OUT/pytest-c.log 2>&1; echo "pytest rc=$?"
tail -2 $OUT/pytest-c.log; grep -E "^FAILED|^E  " $OUT/pytest-c.log | head -10
echo "--- t=$((SECONDS-T0)) memcheck"
left=$(( ${LIMIT:-585} - SECONDS + T0 - 5 ))
timeout $left compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/sanitize.py --device cuda --ops decode \
  --dtype bf16 --match "${MATCH:-tile pairs,merge pdl}" > $OUT/memcheck-c.log 2>&1; echo "memcheck rc=$?"
tail -3 $OUT/memcheck-c.log
echo "--- t=$((SECONDS-T0))"
