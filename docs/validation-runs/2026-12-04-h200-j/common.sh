# sourced by the call scripts of session 8 (run J)
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
S=${TMPDIR:-/tmp}/s10; mkdir -p $S/logs $S/out
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
T0=$SECONDS
left() { local l=$((LIM - (SECONDS - T0))); [ $l -gt $1 ] && echo $1 || echo $l; }
running() { [ -f $S/$1.pid ] && kill -0 "$(cat $S/$1.pid)" 2>/dev/null; }
progress() {
  echo "t=$((SECONDS-T0)) bench: running=$(running bench && echo y || echo n) $(grep -c "^## " $S/logs/bench-decode*.log | tail -1 2>/dev/null) sections, last: $(tail -n 1 $S/logs/bench-job.log 2>/dev/null | cut -c1-100)" \
    "| validate: running=$(running validate && echo y || echo n) $(grep -E '^\s*\[[0-9]+/' $S/logs/validate.log 2>/dev/null | tail -1 | cut -c1-140)"
}
collect() {  # one tarball: the device returns at most a few files
  (cd $S && tar -czf $OUT/run-j.tar.gz logs out $(ls -d validate validate-fp8 2>/dev/null))
  nvidia-smi --query-gpu=memory.used,utilization.gpu,clocks.sm --format=csv,noheader
}
