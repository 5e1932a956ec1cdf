#!/usr/bin/env bash
# call B: the GPU tests of the default (its work-split scan changed on 2026-12-05) and the page_tile configs (and skew,
# lazy), then compute-sanitizer memcheck over the page-tile cases and the plain-Triton decode with fp16 (open since run N)
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
timeout 330 python3 -m pytest -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py \
  -k "rNone-cvt8-lean or default or pagetile or page-tile or lazy or never_reads or split_counts" --maxfail=10 -q > $OUT/pytest-pagetile.log 2>&1; echo "pytest rc=$?"
tail -3 $OUT/pytest-pagetile.log; grep -E " FAILED|^E  " $OUT/pytest-pagetile.log | head -10
left=$(( 585 - SECONDS + T0 ))
timeout $(( left > 300 ? 250 : left / 2 )) compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/sanitize.py --device cuda \
  --ops decode --dtype bf16 --match "page tile" > $OUT/memcheck-pagetile.log 2>&1; echo "memcheck rc=$?"
tail -4 $OUT/memcheck-pagetile.log
left=$(( 585 - SECONDS + T0 ))
timeout $((left - 5)) compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/sanitize.py --device cuda \
  --ops decode --dtype fp16 --match "splits1 valid,splits3 valid,splits1 bad,splits3 bad,splits1 seq,splits3 seq,splits1 tensor,splits3 tensor,splits1 sm,splits3 sm" \
  > $OUT/memcheck-fp16-plain.log 2>&1; echo "memcheck fp16 rc=$?"
tail -4 $OUT/memcheck-fp16-plain.log
echo "--- t=$((SECONDS-T0))"
