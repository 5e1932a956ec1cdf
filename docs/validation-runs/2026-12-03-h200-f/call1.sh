#!/usr/bin/env bash
# session 4, call A: bundle part 1 (pydantic from it), decode bench (no FlashInfer; wave rule), rotation bench, ncu 1 x 8K
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
timeout 120 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -3 $OUT/unpack1.log
D=<scratch>/dep; mkdir -p $D
for m in pydantic pydantic_core annotated_types; do ln -sfn $PWD/.bundle/site/common/$m $D/$m; done
python3 -m pip install -q --no-index --no-deps --target $D .gpu/typing_inspection*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:$D
python3 -c "import pydantic, nvfp4compat.plan; print('pydantic', pydantic.__version__)" || exit 1
echo "--- t=$((SECONDS-T0))"
timeout 120 python3 benchmarks/bench_attention.py --no-flashinfer --no-sweep --shapes decode --json $OUT/bench_decode.json > $OUT/bench-decode.log 2>&1; echo rc=$?
grep -E "^\| triton|^## " $OUT/bench-decode.log | cut -c1-220
echo "--- t=$((SECONDS-T0))"
timeout 120 python3 benchmarks/bench_rotation.py --json $OUT/bench_rotation.json > $OUT/bench-rotation.log 2>&1; echo rc=$?
tail -30 $OUT/bench-rotation.log | cut -c1-220
echo "--- t=$((SECONDS-T0))"
timeout 60 ncu --clock-control none --kernel-name regex:"_decode_kernel|_decode_reduce" --launch-skip 4 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats python3 benchmarks/profile_attention.py --shape "decode 1 x 8K" > $OUT/ncu-1x8K.log 2>&1; echo ncu rc=$?
grep -E "_decode|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Memory Throughput|Grid Size|Block Size|Waves Per|Stall" $OUT/ncu-1x8K.log | head -40
echo "--- t=$((SECONDS-T0))"
