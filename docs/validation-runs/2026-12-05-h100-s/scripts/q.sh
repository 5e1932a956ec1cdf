#!/usr/bin/env bash
# a last short call of session 21 (run S, call 9): configs 37 / 38 (scales two tiles ahead) on a GPU for the first time:
# their GPU tests over 8 workers, then 35 vs 37 and 20 vs 38 without FlashInfer. carry [".gpu"]
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
S=/tmp/s21x; mkdir -p $S/dep; nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/pydantic*.whl .gpu/fi/typing*.whl .gpu/fi/annotated*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep
set -f
timeout ${TESTS_S:-70} python3 -m pytest -p no:cacheprovider -q -rfE -n 8 --timeout 60 $(cat .gpu/s22/sa2.txt) > $OUT/sa2-tests.log 2>&1
echo "tests rc=$? t=$((SECONDS-T0))"; tail -2 $OUT/sa2-tests.log; grep -E "^(FAILED|ERROR)" $OUT/sa2-tests.log | head -8
timeout $(( ${LIMIT:-130} - SECONDS + T0 )) python3 benchmarks/bench_attention.py --no-flashinfer --watchdog-s 60 \
  --variants "scales_ahead=2,ring=4&tma_loader=False&tile_pairs=False&scales_ahead=1,ring=3&num_warps=4&defer_sum=False&maxnreg=128&scales_ahead=1" \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K" --json $OUT/sa2-bench.json > $OUT/sa2-bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"; grep -E "^\| triton" $OUT/sa2-bench.log | awk -F'|' '{print $3 "|" $4}' | sed 's/DecodeConfig(block_n=64.*ring=/ring=/; s/, tma_loader=False, / /' | cut -c1-120
