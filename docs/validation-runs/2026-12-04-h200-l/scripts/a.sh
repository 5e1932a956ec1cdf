#!/usr/bin/env bash
# call A: bundle parts 2-3 (pydantic), then the envelope timing
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -3 $OUT/unpack1.log
D=${TMPDIR:-/tmp}/s12dep; mkdir -p $D
python3 -m pip install -q --no-index --no-deps --target $D .gpu/fi/annotated_types-*.whl .gpu/fi/typing_inspection-*.whl 2>&1 | tail -1
for m in pydantic pydantic_core; do ln -sfn $PWD/.bundle/site/common/$m $D/$m; done
export PYTHONPATH=$PWD:$D
python3 -c "import pydantic, nvfp4compat.kernels.triton.attention; print('pydantic', pydantic.__version__)" 2>&1 | tail -2
echo "--- t=$((SECONDS-T0))"
timeout $((200 - SECONDS + T0)) python3 .gpu/s12/envelope.py 2>&1 | tee $OUT/envelope.log | grep -v Warning
echo "--- t=$((SECONDS-T0))"
