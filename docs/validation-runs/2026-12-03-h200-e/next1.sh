#!/usr/bin/env bash
# next session, call 1 (~520 s): prefetch decode timed (sweep) with FlashInfer; decode vs 73fa462 (issue 16 proof);
# sanitizer (memcheck all ops incl. prefetch cases, racecheck decode+prefill)
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.fi-ws PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
SCRATCH=<scratch>; mkdir -p $SCRATCH; source <(sed -n '/^use_fi()/,/^}/p' scripts/gpu/suite.sh); ROOT=$PWD; use_fi 0.7.2.post1 > /dev/null 2>&1
timeout 120 python3 benchmarks/bench_attention.py --no-flashinfer --shapes decode --baseline .gpu/att_base_73fa462.py --json $OUT/bench_decode_sweep.json > $OUT/bench-decode-sweep.log 2>&1; echo rc=$?
grep -E "^\| triton|^## " $OUT/bench-decode-sweep.log | cut -c1-190
echo "--- t=$((SECONDS-T0))"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py > $OUT/memcheck.log 2>&1; echo memcheck rc=$?; grep -E "ERROR SUMMARY|cases" $OUT/memcheck.log | tail -2
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize.py --ops decode,prefill > $OUT/racecheck.log 2>&1; echo racecheck rc=$?; grep -E "RACECHECK SUMMARY|cases" $OUT/racecheck.log | tail -2
echo "--- t=$((SECONDS-T0))"
