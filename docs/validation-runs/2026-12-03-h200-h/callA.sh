#!/usr/bin/env bash
# session 6, call A: GPU prefill composite tests (incl. rotated, fused), writer graph capture, bench_rotation (fused
# rotation incl. dequant_fa3), decode sweep (capped byte configs) with FlashInfer 0.7.2.post1 in the same run
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=<scratch>/fi-ws PYTHONUNBUFFERED=1
T0=$SECONDS; LIM=565
left() { local l=$((LIM - (SECONDS - T0))); [ $l -gt $1 ] && echo $1 || echo $l; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r; nproc
SCRATCH=<scratch>; mkdir -p $SCRATCH; source <(sed -n '/^use_fi()/,/^}/p' scripts/gpu/suite.sh); ROOT=$PWD
use_fi 0.7.2.post1 || exit 1
python3 -c "import pydantic, nvfp4compat.plan, triton, torch, pytest, xdist; print('pydantic', pydantic.__version__, 'triton', triton.__version__, 'torch', torch.__version__, 'pytest', pytest.__version__)" || exit 1
echo "--- t=$((SECONDS-T0)) gpu tests"
timeout $(left 60) python3 -m pytest -q -m gpu tests/kernels/test_gpu_codec.py -k "captured_in_a_cuda_graph" -p no:cacheprovider > $OUT/gpu-codec-graph.log 2>&1; echo rc=$?
tail -4 $OUT/gpu-codec-graph.log
timeout $(left 250) python3 -m pytest -q -m gpu -n 6 -rA tests/kernels/test_gpu_prefill_dequant.py -p no:cacheprovider > $OUT/gpu-prefill-dequant.log 2>&1; echo rc=$?
grep -E "passed|failed|PASSED|FAILED|ERROR|rotated:" $OUT/gpu-prefill-dequant.log | tail -45
echo "--- t=$((SECONDS-T0)) bench_rotation"
timeout $(left 170) python3 benchmarks/bench_rotation.py --shapes "decode 16 x 16K,decode 1 x 8K,decode ragged 8 x 1K-30K,prefill 2 x 8K causal,prefill 6 x 1K chunks on 16K" --json $OUT/bench_rotation.json > $OUT/bench-rotation.log 2>&1; echo rc=$?
grep -E "^\| |^#" $OUT/bench-rotation.log | cut -c1-260
echo "--- t=$((SECONDS-T0)) decode sweep"
timeout $(left 300) python3 benchmarks/bench_attention.py --shapes "decode 16 x 16K,decode ragged 8 x 1K-30K" --json $OUT/bench_decode_sweep.json > $OUT/bench-decode-sweep.log 2>&1; echo rc=$?
grep -E "^\| |^## " $OUT/bench-decode-sweep.log | grep -vE "^\|---" | cut -c1-250 | head -60
echo "--- t=$((SECONDS-T0)) end"
