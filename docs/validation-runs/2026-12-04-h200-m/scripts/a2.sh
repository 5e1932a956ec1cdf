#!/usr/bin/env bash
# call A (session 11): bundle parts 2-3 unpacked (pydantic from them), then ncu pipe counters of the default and kt_logits decodes
set -u; export PYTHONUNBUFFERED=1; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
timeout 150 python3 tools/gpu_bundle/run_on_device.py unpack --partial-ok > $OUT/unpack1.log 2>&1; echo unpack rc=$?; tail -3 $OUT/unpack1.log
D=${TMPDIR:-/tmp}/s13dep; mkdir -p $D
python3 -m pip install -q --no-index --no-deps --target $D .gpu/fi/annotated_types-*.whl .gpu/fi/typing_inspection-*.whl 2>&1 | tail -1
for m in pydantic pydantic_core; do ln -sfn $PWD/.bundle/site/common/$m $D/$m; done
export PYTHONPATH=$PWD:$D
echo "--- t=$((SECONDS-T0))"
for g in 0 4; do
  timeout 80 ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight \
    --metrics regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_elapsed.avg \
    python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon $g > $OUT/ncu-pipes-g$g.log 2>&1; echo "ncu g$g rc=$?"
  grep -E "Duration|inst_executed_pipe|pipe_.*cycles_active|smsp__inst_executed.sum|Executed Ipc A" $OUT/ncu-pipes-g$g.log | awk '$NF+0 > 1 || !/pipe/' | sed 's/  */ /g' | head -40
  echo "--- t=$((SECONDS-T0))"
done
