# sourced by the call scripts of session 7 (run I)
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=<scratch>/fi-ws PYTHONUNBUFFERED=1
S=<scratch>; mkdir -p $S/logs
T0=$SECONDS
left() { local l=$((LIM - (SECONDS - T0))); [ $l -gt $1 ] && echo $1 || echo $l; }
F=tests/kernels/test_gpu_prefill_dequant.py
prefill_tests_bg() {  # the whole GPU prefill-composite file, serial, in its own session (outlives the call)
  ( B=$PWD/.bundle/site; export PYTHONPATH=$PWD:$B/fi-0.6.14:$B/common
    python3 -c "import flashinfer, pydantic, torch, triton; print('flashinfer', flashinfer.__version__, 'pydantic', pydantic.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" || exit 1
    setsid nohup timeout 1500 python3 -m pytest -q -m gpu -rA --durations=0 -p no:cacheprovider \
      $F::test_features_match_reference $F::test_groups_under_a_small_cap_and_oversize_requests \
      $F::test_refused_under_cuda_graph_capture $F::test_rotated_cache_fused_rotation $F::test_matches_reference \
      > $S/logs/prefill-tests.log 2>&1 < /dev/null &
    echo $! > $S/prefill-tests.pid )
}
running() { [ -f $S/$1.pid ] && kill -0 "$(cat $S/$1.pid)" 2>/dev/null; }
progress() {
  echo "t=$((SECONDS-T0)) alive=$(( $(date +%s) - $(cat $S/alive 2>/dev/null || echo 0) ))s-ago" \
    "prefill: $(grep -cE ' PASSED|^\.|PASSED' $S/logs/prefill-tests.log 2>/dev/null) lines, running=$(running prefill-tests && echo y || echo n)" \
    "validate: running=$(running validate && echo y || echo n) $(grep -E '^\s*\[[0-9]+/' $S/logs/validate.log 2>/dev/null | tail -1 | cut -c1-120)"
}
collect() {
  cp -r $S/logs $OUT/ 2>/dev/null
  [ -d $S/validate ] && cp -r $S/validate $OUT/ 2>/dev/null
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
}
