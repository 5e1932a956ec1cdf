#!/usr/bin/env bash
# call A: smoke (the default's new addressing, tile pairs, ring pairs, the merge as a dependent launch), then the new
# configs against the default and FlashInfer 0.7.2.post1 on the six decode shapes, with MERGE_PDL=1 as a knob row.
# carry: [".gpu"]
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=${TMPDIR:-/tmp}/s18; mkdir -p $S/fi $S/dep
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; uname -r
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep:$S/fi
echo "--- t=$((SECONDS-T0)) smoke"
timeout ${SMOKE:-170} python3 -m pytest -p no:cacheprovider -rf -q $(cat .gpu/s18/smoke.txt) > $OUT/smoke.log 2>&1; echo "smoke rc=$?"
tail -2 $OUT/smoke.log; grep -E "^FAILED|^E  " $OUT/smoke.log | head -8
echo "--- t=$((SECONDS-T0)) bench"
# 28 pairs, 29 pairs + defer, 31 ring-4 pairs (4 warps), 20 ring 3, 22 defer; call B times 26, 27, 30, 32
V=${VARIANTS:-"tile_pairs=True&ring=0&num_warps=4&defer_sum=False,tile_pairs=True&defer_sum=True,tile_pairs=True&ring=4&num_warps=4,ring=3&num_warps=4&defer_sum=False&maxnreg=128,defer_sum=True&tile_pairs=False&lazy_rescale=False&ring=0&num_warps=4"}
KNOB=${KNOB-"--knob MERGE_PDL=1"}
left=$(( ${LIMIT:-585} - SECONDS + T0 - 5 ))
timeout $left python3 benchmarks/bench_attention.py --variants "$V" $KNOB \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $OUT/bench${TAG:-}.json > $OUT/bench${TAG:-}.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4|FlashInfer)" $OUT/bench${TAG:-}.log | cut -c1-70,250-420 | head -80
echo "--- t=$((SECONDS-T0))"
