#!/usr/bin/env bash
# call A (s21): decode against FlashInfer 0.7.2.post1 on six shapes (the default, VARIANTS, KNOBS), then ncu of NCU's
# configs at 16 x 16K. Compile caches: restored from .bundle/caches (carry it when it holds fi072.tar.xz.NN), saved as
# fi072 when none was carried. bench_attention logs each step with its time on stderr (bench.log), writes bench.json
# after each shape and prints the Python stacks of a step that runs past WATCHDOG s.
# carry: [".gpu", ".bundle/caches"]
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=/tmp/s21; mkdir -p $S/fi $S/dep
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; uname -r
# an H100 already has its ratio table (runs P, Q): ON_H100=suite spends the call on a third of the GPU suite instead
if [ "${ON_H100:-bench}" = suite ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
  echo "H100: the GPU suite's shard ${SHARD:-1} instead of the bench"; exec bash .gpu/s21/c.sh
fi
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
# ninja (FlashInfer's JIT) rebuilds a module whose inputs are newer than its objects: date the freshly extracted
# package and wheels back, so the restored objects are current
[ -e $S/dated ] || { find $S/fi $S/dep -exec touch -h -d 2020-01-01 {} + && touch $S/dated; }
python3 tools/gpu_bundle/run_on_device.py caches restore --site $S/state 2>&1 | tail -3
had_cache=$(ls .bundle/caches/fi072.tar.xz* 2>/dev/null | wc -l)
export PYTHONPATH=$PWD:$S/dep:$S/fi
echo "--- t=$((SECONDS-T0)) bench"
# the deeper-prefetch configs, which lost 0-20% on the H100 (at 72% of its DRAM peak) but may pay on the H200 (run O's
# default there: 57%): 20 (ring 3), 27 (ring 3, 96 registers, 5/SM), 33 (TMA ring 4), 34 (TMA ring 6), 35 / 36
# (cp.async rings 4 / 5, new: never on a GPU before; their GPU tests are in the suite's shards)
V=${VARIANTS-"ring=3&num_warps=4&defer_sum=False&maxnreg=128,ring=3&maxnreg=96,tma_loader=True&ring=4,ring=6,ring=4&tma_loader=False&tile_pairs=False,ring=5"}
KN=${KNOBS-"--knob MERGE_PDL=1"}
left=$(( ${LIMIT:-585} - SECONDS + T0 - ${NCU_S:-95} - ( had_cache ? 0 : ${SAVE_S:-45} ) ))
if [ -n "$V" ]; then SEL=(--variants "$V"); else SEL=(--no-sweep); fi
timeout $left python3 benchmarks/bench_attention.py "${SEL[@]}" $KN --watchdog-s ${WATCHDOG:-150} \
  --shapes "${SHAPES:-decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K}" \
  --json $OUT/bench${TAG:-}.json > $OUT/bench${TAG:-}.log 2>&1; echo "bench rc=$?"
grep "^\[bench_attention" $OUT/bench${TAG:-}.log | tail -2
python3 .gpu/s21/table.py $OUT/bench${TAG:-}.json
if [ "$had_cache" = 0 ]; then
  timeout ${SAVE_S:-45} python3 tools/gpu_bundle/run_on_device.py caches save --name fi072 --cache-max-chunks 3 2>&1 | tail -2
fi
# 33 with SourceCounters: which SASS lines its barrier stalls sit on (run Q: 6.1 per issued instruction)
for g in ${NCU-11 33}; do
  timeout 45 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SourceCounters \
    --metrics smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$ \
    python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon $g > $OUT/ncu-g$g${TAG:-}.log 2>&1
  echo "ncu g$g rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Block Size|stalled_(long|barrier)" $OUT/ncu-g$g${TAG:-}.log | sed 's/  */ /g' | head -9
done
echo "--- t=$((SECONDS-T0))"
