#!/usr/bin/env bash
# call A (session 12): FlashInfer 0.7.2.post1 carried; lean / lean+kt timed against the default and FlashInfer,
# per-pipe instruction counts (ncu), then the lean GPU tests
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=${TMPDIR:-/tmp}/s15; mkdir -p $S/fi $S/dep
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; uname -r
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$S/dep:$S/fi
left() { echo $(( ${LIMIT:-585} - (SECONDS - T0) )); }
echo "--- t=$((SECONDS-T0)) bench"
timeout 260 python3 benchmarks/bench_attention.py --variants "lean=True,kt_logits=True" \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4|FlashInfer)" $OUT/bench.log | cut -c1-70,250-420
echo "--- t=$((SECONDS-T0)) ncu"
for g in 0 5 6; do
  timeout 45 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy \
    --metrics regex:smsp__inst_executed_pipe_.*\.sum$,smsp__inst_executed.sum,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active \
    python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon $g > $OUT/ncu-g$g.log 2>&1; echo "ncu g$g rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|DRAM Throughput|inst_executed" $OUT/ncu-g$g.log | awk '$NF+0 > 0 || !/inst_executed/' | sed 's/  */ /g' | head -50
done
echo "--- t=$((SECONDS-T0)) pytest"
timeout $(( $(left) - 5 )) python3 -m pytest -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py \
  -k "lean" -v > $OUT/pytest-lean.log 2>&1; echo "pytest rc=$?"
echo "PASSED $(grep -c " PASSED" $OUT/pytest-lean.log) FAILED $(grep -c " FAILED" $OUT/pytest-lean.log)"; grep -E " FAILED|^E  |passed|failed" $OUT/pytest-lean.log | cut -c1-220 | tail -20
echo "--- t=$((SECONDS-T0))"
