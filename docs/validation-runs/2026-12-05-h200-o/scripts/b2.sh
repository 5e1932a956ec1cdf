#!/usr/bin/env bash
# call B2: GPU tests of the default (work-split scan changed) and of config 11 (lean+kt+page_tile), node ids in ids.txt
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
S=${TMPDIR:-/tmp}/s16; mkdir -p $S/dep
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep
timeout ${LIMIT:-480} python3 -m pytest -p no:cacheprovider -rf $(cat .gpu/s16/ids.txt) -q > $OUT/pytest-b2.log 2>&1; echo "pytest rc=$?"
tail -3 $OUT/pytest-b2.log; grep -E "FAILED|^E  " $OUT/pytest-b2.log | head -10
echo "--- t=$((SECONDS-T0))"
