#!/usr/bin/env bash
# GPU tier of nvfp4compat, run on a CUDA machine with FlashInfer builds carried in .gpu/
# (fi-<version>.tar.xz: a flashinfer-python wheel's tree, pruned as docs/kernels.md says, plus cp312
# wheels of apache-tvm-ffi and of nvfp4compat's own requirements the image lacks: pydantic & co). Usage: scripts/gpu/suite.sh STAGE [STAGE...]; results go to $OUT.
#   golden      FlashInfer 0.6.15 and 0.7.4 conformance vectors (scripts/make_golden.py)
#   codec       GPU writer/dequant tests vs FlashInfer 0.7.4 (bytes, CUDA graphs, both impls)
#   bench-codec write + dequant benchmarks side by side with FlashInfer 0.7.2.post1
#   attention   GPU attention tests + attention-level needle retrieval (FlashInfer 0.7.2.post1)
#   bench-attn  attention benchmarks side by side with FlashInfer 0.7.2.post1
#   decode      GPU decode tests, the decode benchmark with its sweep and the previous kernel
#               (.gpu/att_baseline.py, from `git show REV:nvfp4compat/kernels/triton/attention.py`)
#               in the same run, and Nsight Compute counters of the default decode
#   safety      scripts/sanitize.py plain, under compute-sanitizer memcheck (all four kernels) and
#               racecheck (decode, prefill); the decoders' bit-exactness test on the GPU
#   decode-check the decode shapes, default config only, against .gpu/att_baseline.py (no FlashInfer)
#   prefill     benchmarks/bench_prefill.py (FA3/FA2 bf16, FA2 NVFP4, fused Triton, dequant + FA3)
#   gluon       the Gluon decode: its GPU tests (every path it builds: bf16/fp16, 1-16 rows, windows, sinks,
#               odd pages, varlen rows), the decode tier, memcheck over the decode cases, the decode shapes against
#               FlashInfer (default config and the plain-Triton default), Nsight Compute counters
set -uo pipefail
cd "$(dirname "$0")/../.."
SCRATCH=${TMPDIR:-/tmp}
OUT=${OUT:-$SCRATCH/nvfp4compat-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
ROOT=$PWD

use_fi() {  # use_fi VERSION: unpack once, then put it first on PYTHONPATH
  local v=$1 d=$SCRATCH/fi-$1
  if [ ! -d "$d/flashinfer" ]; then mkdir -p "$d" && tar -xJf ".gpu/fi-$v.tar.xz" -C "$d" || return 1; fi
  if [ ! -d "$SCRATCH/dep/pydantic" ] || [ ! -d "$SCRATCH/dep/tvm_ffi" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SCRATCH/dep" .gpu/*.whl || return 1
  fi
  export PYTHONPATH="$ROOT:$SCRATCH/dep:$d"
  python3 -c "import flashinfer, sys; print('flashinfer', flashinfer.__version__, file=sys.stderr)"
}

step() {  # step NAME CMD...: run, time, log to $OUT/NAME.log, never abort the suite
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n 25 "$OUT/$name.log"
}

for stage in "$@"; do
  case $stage in
    golden)
      use_fi 0.6.15 && step golden-0.6.15 python3 scripts/make_golden.py --out "$OUT"
      use_fi 0.7.4 && step golden-0.7.4 python3 scripts/make_golden.py --out "$OUT" ;;
    codec)
      use_fi 0.7.4 && step codec-tests python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
        tests/kernels/test_gpu_codec.py tests/kernels/test_write.py tests/kernels/test_dequant.py -s ;;
    bench-codec)
      use_fi 0.7.2.post1 && step bench-write python3 benchmarks/bench_write.py
      step bench-dequant python3 benchmarks/bench_dequant.py ;;
    attention)
      use_fi 0.7.2.post1 && step attention-triton python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_gpu_attention.py -k "not flashinfer"
      step attention-flashinfer python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_gpu_attention.py -k flashinfer
      step needle python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_needle.py -s ;;
    bench-attn)
      use_fi 0.7.2.post1 && step bench-decode python3 benchmarks/bench_attention.py --shapes decode --json "$OUT/bench_decode.json"
      step bench-prefill python3 benchmarks/bench_attention.py --shapes prefill,mixed --json "$OUT/bench_prefill.json" ;;
    decode)
      use_fi 0.7.2.post1 && step attention-decode python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_gpu_attention.py -k "decode and not flashinfer"
      base=(); [ -f .gpu/att_baseline.py ] && base=(--baseline .gpu/att_baseline.py)
      step bench-decode python3 benchmarks/bench_attention.py --shapes decode "${base[@]}" --json "$OUT/bench_decode.json"
      for shape in "decode 16 x 16K" "decode ragged" "decode 1 x 8K"; do
        tag=$(echo "$shape" | tr -c 'A-Za-z0-9\n' '_')
        step "ncu-$tag" ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
          python3 benchmarks/profile_attention.py --shape "$shape"
      done ;;
    safety)
      use_fi 0.7.2.post1 || exit 1  # (for PYTHONPATH and pydantic; the kernels need no FlashInfer)
      export PYTORCH_NO_CUDA_MEMORY_CACHING=1
      step bitexact timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention.py -k "bit_exact"
      step sanitize timeout 120 python3 scripts/sanitize.py
      step memcheck timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py
      step racecheck timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize.py --ops decode,prefill
      unset PYTORCH_NO_CUDA_MEMORY_CACHING ;;
    decode-check)
      use_fi 0.7.2.post1 || exit 1
      base=(); [ -f .gpu/att_baseline.py ] && base=(--baseline .gpu/att_baseline.py)
      step bench-decode-check timeout 240 python3 benchmarks/bench_attention.py --no-sweep --no-flashinfer \
        --shapes "decode 16,decode 128,decode ragged,decode 1 x,decode 4 x,decode 32" "${base[@]}" \
        --json "$OUT/bench_decode_check.json" ;;
    prefill)
      use_fi 0.7.2.post1 && step bench-prefill timeout 400 python3 benchmarks/bench_prefill.py --json "$OUT/bench_prefill.json" ;;
    gluon)
      use_fi 0.7.2.post1 || exit 1
      step gluon-tests timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py
      step decode-tier timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_attention.py \
        -k "decode and not flashinfer"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck-decode timeout 300 compute-sanitizer --tool memcheck \
        --error-exitcode 3 python3 scripts/sanitize.py --ops decode
      step bench-decode-gluon timeout 500 python3 benchmarks/bench_attention.py --no-sweep --shapes decode \
        --json "$OUT/bench_decode_gluon.json"
      step ncu-gluon-16x16K ncu --clock-control none --kernel-name regex:gluon_decode --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/gpu.csv" 2>&1
