#!/usr/bin/env bash
# call A (s20): on the H200. Step 1 (optional): pytest of SMOKE_IDS. Step 2: the default, config 33 (TMA loader, ring 4)
# and MERGE_PDL=1 against FlashInfer 0.7.2.post1 on six decode shapes (VARIANTS, KNOBS). Step 3: ncu at 16 x 16K of NCU's
# configs. carry: [".gpu"]
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=${TMPDIR:-/tmp}/s20; mkdir -p $S/fi $S/dep
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; uname -r
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep:$S/fi
if [ -n "${SMOKE_IDS-}" ]; then
  timeout ${SMOKE:-180} python3 -m pytest -p no:cacheprovider -rf -q $(cat ${SMOKE_IDS-}) \
    > $OUT/smoke${TAG:-}.log 2>&1; echo "smoke rc=$?"
  tail -2 $OUT/smoke${TAG:-}.log; grep -E "^FAILED|^E  " $OUT/smoke${TAG:-}.log | head -8
fi
echo "--- t=$((SECONDS-T0)) bench"
# default: 33 and 34 (TMA loader, ring 4 / ring 6), 20 (ring 3), 31 (ring-4 pairs), and MERGE_PDL
V=${VARIANTS:-"tma_loader=True&ring=4,ring=3&num_warps=4&defer_sum=False&maxnreg=128"}
KN=${KNOBS-"--knob MERGE_PDL=1"}
left=$(( ${LIMIT:-585} - SECONDS + T0 - ${NCU_S:-60} ))
timeout $left python3 benchmarks/bench_attention.py --variants "$V" $KN \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $OUT/bench${TAG:-}.json > $OUT/bench${TAG:-}.log 2>&1; echo "bench rc=$?"
python3 .gpu/s20/table.py $OUT/bench${TAG:-}.json
for g in ${NCU-11}; do
  timeout 50 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --metrics smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$ \
    python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon $g > $OUT/ncu-g$g${TAG:-}.log 2>&1
  echo "ncu g$g rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Block Size|inst_executed.sum|stalled_(long|wait|barrier|short)" $OUT/ncu-g$g${TAG:-}.log | sed 's/  */ /g' | head -14
done
echo "--- t=$((SECONDS-T0))"
