#!/usr/bin/env bash
# call E (session 11): bundle parts 2-3, then the one-compile check of the kernels (do_not_specialize)
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
timeout 100 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -2 $OUT/unpack1.log
D=${TMPDIR:-/tmp}/s13dep; mkdir -p $D
python3 -m pip install -q --no-index --no-deps --target $D .gpu/fi/annotated_types-*.whl .gpu/fi/typing_inspection-*.whl 2>&1 | tail -1
for m in pydantic pydantic_core; do ln -sfn $PWD/.bundle/site/common/$m $D/$m; done
export PYTHONPATH=$PWD:$D
timeout 150 python3 .gpu/s13/spec.py 2>&1 | tee $OUT/spec.log | grep -v Warn | tail -12
echo "--- t=$((SECONDS-T0))"
