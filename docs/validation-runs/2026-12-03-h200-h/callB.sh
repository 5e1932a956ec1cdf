#!/usr/bin/env bash
# session 6, call B: the bundle's first part unpacked; the Triton decode sweep (no FlashInfer) on 16 x 16K while warm
set -u
export PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 120 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -n 3 $OUT/unpack1.log
echo "--- t=$((SECONDS-T0))"
D=<scratch>/dep-b; mkdir -p $D
for m in pydantic pydantic_core annotated_types typing_inspection typing_extensions.py; do
  [ -e .bundle/site/common/$m ] && ln -sfn $PWD/.bundle/site/common/$m $D/$m
done
ls $D
export PYTHONPATH=$PWD:$D
python3 -c "import pydantic, nvfp4compat.plan; print('pydantic', pydantic.__version__)" || exit 0
timeout 200 python3 benchmarks/bench_attention.py --no-flashinfer --shapes "decode 16 x 16K" --json $OUT/bench_decode_sweep_nofi.json > $OUT/bench-decode-sweep-nofi.log 2>&1; echo rc=$?
grep -E "^\| |^## |^# " $OUT/bench-decode-sweep-nofi.log | grep -vE "^\|---" | cut -c1-260 | head -30
echo "--- t=$((SECONDS-T0)) end"
