#!/usr/bin/env bash
# GPU tier of nvfp4compat, run on a CUDA machine with FlashInfer builds carried in .gpu/
# (fi-<version>.tar.xz: a flashinfer-python wheel's tree, csrc pruned by build.py's FLASHINFER_CSRC_PRUNE, plus cp312
# wheels of apache-tvm-ffi and of nvfp4compat's own requirements the image lacks: pydantic & co). Usage: scripts/gpu/suite.sh STAGE [STAGE...]; results go to $OUT.
# `python3 tools/gpu_bundle/build.py kit --out .gpu` builds what this script expects (a fresh checkout has no .gpu/;
# add --flashinfer 0.6.15 0.7.4 for golden and codec); carry [".gpu"], plus ".bundle/caches" where it holds archives.
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
#   variants    decode against FlashInfer 0.7.2.post1 on SHAPES (default: the six decode shapes), the sweep rows
#               VARIANTS selects (bench_attention.py --variants; unset or empty: --no-sweep) and KNOBS (default
#               "--knob MERGE_PDL=0,1": the plain merge launch and the early trigger against the default's late one),
#               within LIMIT s (default 585) less the ncu runs; SPECS: ';'-separated shape descriptions
#               (bench_attention.py --shape, e.g. "decode 1 x 2K;decode ragged 64 x 0.1K-8K"; an item "general": GENERAL_SPECS),
#               timed alone unless SHAPES is also set; the ratio table
#               (scripts/gpu/table.py); ncu of each Gluon config index in NCU (default: the default's) at 16 x 16K with the
#               stall reasons and SourceCounters, NCU_S s each (default 45); NCU_SOURCE=1: also each SASS line's
#               counters (ncu --page source --csv), ranked by scripts/gpu/ncu_source.py. TAG: a suffix for its files
#   config      the Gluon GPU tests whose ids hold MATCH (pytest -k "$MATCH", N workers, default 8, 120 s a test,
#               TESTS_S in all, default 300), then memcheck of the decode cases matching MEMCHECK_MATCH
#               (scripts/sanitize.py --match words, e.g. "ring 4"; empty: no memcheck) within MEMCHECK_S (200)
#   shard       shard SHARD (1..SHARDS, defaults 1 and 3) of the GPU attention suite (test_gpu_attention.py and
#               test_gpu_decode_gluon.py; ids collected here with -m gpu, dealt round-robin), N workers (default
#               12), 300 s a test, within LIMIT s (default 585); then its failures again on 2 workers, RERUN_S
#               (default 120) kept for that (run S: 12 processes on one 80 GB card ran out of memory). LIST=FILE
#               runs the ids in FILE instead. Writes OUT/NAME.txt (ids), NAME-failed.txt, NAME-notrun.txt
#               (ids without a result: the time limit), NAME-still-failed.txt
#   caches      save the compile caches (FlashInfer's JIT modules, then vLLM's and Triton's while they fit) as
#               OUT/CACHE_NAME.tar.xz.NN (default name suite, CACHE_CHUNKS chunks of 15 MiB, default 1); bring
#               them back as .bundle/caches/ (carry it) and every run restores them before its first stage.
#               FlashInfer reuses a restored module only where its paths match: this script's $TMPDIR/fi-<version>
#               and $TMPDIR/dep (run S's a.sh built under /tmp/s21: its archives do not serve this script)
# Each stage runs on whatever the ones before it left; one that lacks its kit says so and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
SCRATCH=${TMPDIR:-/tmp}
OUT=${OUT:-$SCRATCH/nvfp4compat-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

fi_arch() {  # the FlashInfer JIT arch of GPU 0 (nvidia-smi's compute_cap; 9.0a on Hopper), nothing without a GPU
  local cap
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
  case $cap in
    9.0) echo 9.0a ;;
    [0-9]*.[0-9]*) echo "$cap" ;;
  esac
}

# FlashInfer's JIT builds for this GPU's arch only (about 25 s a module for 9.0a; on a fresh machine the first shape's
# builds for every arch took run T's call 4 past a 200 s limit); a value set by the caller is kept
if [ -z "${FLASHINFER_CUDA_ARCH_LIST:-}" ]; then
  arch=$(fi_arch)
  [ -n "$arch" ] && export FLASHINFER_CUDA_ARCH_LIST=$arch
fi
ROOT=$PWD

KIT_MTIME=1700000000  # tools/gpu_bundle/build.py's MTIME: the date of every file in .gpu/fi-*.tar.xz
DECODE_SHAPES="decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K"
GPU_SUITE=(tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_decode_gluon.py)
# SPECS=general: decode shapes outside the issue's table (bench_attention.py --shape descriptions; docs/validation.md
# open check 5): short and long single requests, small and wide uniform batches, ragged mixes, GQA 8 on 4 KV heads,
# pages of 32
GENERAL_SPECS="decode 1 x 1K;decode 1 x 2K;decode 2 x 4K;decode ragged 32 x 0.1K-16K;decode ragged 16 x 1K-64K;decode 1 x 32K"
GENERAL_SPECS+=";decode 256 x 1K;decode ragged 64 x 0.5K-4K;decode 64 x 4K 32/4 heads;decode 8 x 8K page 32;decode 1 x 128K"
GENERAL_SPECS+=";decode ragged 4 x 0.2K-60K"

use_fi() {  # use_fi VERSION: unpack once, then put it first on PYTHONPATH
  local v=$1 d=$SCRATCH/fi-$1
  if [ ! -d "$d/flashinfer" ]; then mkdir -p "$d" && tar -xJf ".gpu/fi-$v.tar.xz" -C "$d" || return 1; fi
  if [ ! -d "$SCRATCH/dep/pydantic" ] || [ ! -d "$SCRATCH/dep/tvm_ffi" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SCRATCH/dep" .gpu/*.whl || return 1
    # tvm_ffi's headers are inputs of FlashInfer's JIT: dated back like the archive, so ninja finds the
    # modules restored from .bundle/caches current instead of rebuilding them
    find "$SCRATCH/dep" -exec touch -h -d "@$KIT_MTIME" {} +
  fi
  export PYTHONPATH="$ROOT:$SCRATCH/dep:$d"
  python3 -c "import flashinfer, sys; print('flashinfer', flashinfer.__version__, file=sys.stderr)"
}

no_kit() {  # no_kit STAGE VERSION: say why a stage is skipped
  echo "=== $1: skipped: FlashInfer $2 does not import from .gpu/fi-$2.tar.xz and .gpu/*.whl (the error is above;" \
    "a missing kit: python3 tools/gpu_bundle/build.py kit --out .gpu --flashinfer $2)"
}

result_ids() {  # result_ids IDS LOG failed|notrun|unpassed: the ids listed in file IDS that the pytest -v log LOG
  # shows failed or errored / with no result (a time limit stopped the run) / either of those. Ids hold no spaces.
  awk -v mode="$3" '
    NR == FNR { if ($0 != "") { want[$0] = 1; order[++n] = $0 }; next }
    /(^| )(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)( |$)/ {
      bad_line = /(^| )(FAILED|ERROR)( |$)/
      for (f = 1; f <= NF; f++) if ($f in want) { seen[$f] = 1; if (bad_line) bad[$f] = 1 }
    }
    END {
      for (j = 1; j <= n; j++) {
        id = order[j]
        if (mode == "failed") pick = (id in bad)
        else if (mode == "notrun") pick = !(id in seen)
        else pick = (id in bad) || !(id in seen)
        if (pick) print id
      }
    }' "$1" "$2"
}

bench_shapes() {  # bench_attention.py's shape arguments, one a line: --shapes SHAPES (default the issue's six) unless
  # only SPECS is set, then --shape for each ';'-separated description in SPECS (an item "general": GENERAL_SPECS)
  if [ -z "${SPECS:-}" ] || [ -n "${SHAPES+x}" ]; then printf '%s\n' --shapes "${SHAPES:-$DECODE_SHAPES}"; fi
  [ -n "${SPECS:-}" ] || return 0
  local spec specs gen g
  IFS=';' read -ra specs <<<"$SPECS"
  for spec in "${specs[@]}"; do
    if [ "${spec//[[:space:]]/}" = general ]; then
      IFS=';' read -ra gen <<<"$GENERAL_SPECS"
      for g in "${gen[@]}"; do printf '%s\n' --shape "$g"; done
    elif [ -n "${spec//[[:space:]]/}" ]; then
      printf '%s\n' --shape "$spec"
    fi
  done
  return 0
}

seconds_left() {  # seconds_left T0 LIMIT RESERVE: what LIMIT leaves after T0 and RESERVE (at least 30: timeout 0 never stops)
  local left=$(( $2 - (SECONDS - $1) - $3 ))
  echo $(( left < 30 ? 30 : left ))
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

if compgen -G ".bundle/caches/*.tar.xz*" >/dev/null; then  # compile caches carried from an earlier host
  step caches-restore python3 tools/gpu_bundle/run_on_device.py caches restore --site "$SCRATCH/caches-state"
fi

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
    variants)
      t0=$SECONDS
      use_fi 0.7.2.post1 || { no_kit variants 0.7.2.post1; continue; }
      tag=variants${TAG:-}
      # NCU unset: the default config's index (NCU= : no ncu run)
      gluons=${NCU-$(python3 -c "from nvfp4compat.kernels.triton import attention as a
print(a.GLUON_DECODE_CONFIGS.index(a._DECODE_CONFIGS_GLUON[128]))" 2>/dev/null)}
      sel=(--no-sweep); [ -n "${VARIANTS:-}" ] && sel=(--variants "$VARIANTS")
      read -ra knobs <<<"${KNOBS---knob MERGE_PDL=0,1}"
      per=1; [ -n "${NCU_SOURCE:-}" ] && per=2  # ncu runs per profiled config
      mapfile -t shape_args < <(bench_shapes)
      step "$tag" timeout "$(seconds_left "$t0" "${LIMIT:-585}" $(( $(wc -w <<<"$gluons") * per * ${NCU_S:-45} )))" \
        python3 benchmarks/bench_attention.py "${sel[@]}" "${knobs[@]}" --watchdog-s "${WATCHDOG:-150}" \
        "${shape_args[@]}" --json "$OUT/$tag.json"
      echo "=== $tag-table: python3 scripts/gpu/table.py $OUT/$tag.json"
      python3 scripts/gpu/table.py "$OUT/$tag.json" 2>&1 | tee "$OUT/$tag-table.txt"
      for g in $gluons; do
        step "ncu-g$g${TAG:-}" timeout "${NCU_S:-45}" ncu --clock-control none --kernel-name regex:gluon_decode \
          --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section LaunchStats --section SourceCounters \
          --metrics 'smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
          python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon "$g"
        grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occ|DRAM Throughput|Block Size|stalled_(long|barrier)" \
          "$OUT/ncu-g$g${TAG:-}.log" | sed 's/  */ /g' | head -9
        if [ -n "${NCU_SOURCE:-}" ]; then  # per-SASS-line counters, ranked by scripts/gpu/ncu_source.py
          step "ncu-src-g$g${TAG:-}" timeout "${NCU_S:-45}" ncu --clock-control none --kernel-name regex:gluon_decode \
            --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --page source \
            --print-source sass --csv python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" --gluon "$g"
          python3 scripts/gpu/ncu_source.py "$OUT/ncu-src-g$g${TAG:-}.log" 2>&1 | tee "$OUT/ncu-src-g$g${TAG:-}-top.txt"
        fi
      done ;;
    config)
      use_fi 0.7.2.post1 || { no_kit config 0.7.2.post1; continue; }  # (pydantic; the kernels need no FlashInfer)
      tag=config${TAG:-}
      if [ -z "${MATCH:-}" ]; then
        echo "=== $tag: skipped: MATCH is empty (a pytest -k expression over the Gluon tests' ids, e.g. MATCH=ring4)"
        continue
      fi
      step "$tag-tests" timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -rfE -m gpu -n "${N:-8}" \
        --timeout 120 tests/kernels/test_gpu_decode_gluon.py -k "$MATCH"
      if [ -n "${MEMCHECK_MATCH:-}" ]; then
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "$tag-memcheck" timeout "${MEMCHECK_S:-200}" compute-sanitizer \
          --tool memcheck --error-exitcode 3 python3 scripts/sanitize.py --device cuda --ops decode --dtype bf16 \
          --match "$MEMCHECK_MATCH"
      else
        echo "=== $tag-memcheck: skipped: MEMCHECK_MATCH is empty (scripts/sanitize.py --match words, e.g. \"ring 4\")"
      fi ;;
    shard)
      t0=$SECONDS
      use_fi 0.7.2.post1 || { no_kit shard 0.7.2.post1; continue; }
      if [ -n "${LIST:-}" ]; then
        name=list-$(basename "$LIST" .txt)
        grep -E '^tests/[^ ]+::[^ ]+$' "$LIST" >"$OUT/$name.txt"
      else
        k=${SHARDS:-3} i=${SHARD:-1}
        if ! [[ $k =~ ^[1-9][0-9]*$ && $i =~ ^[1-9][0-9]*$ ]] || (( i > k )); then
          echo "=== shard: skipped: SHARD=$i SHARDS=$k (need 1 <= SHARD <= SHARDS)"; continue
        fi
        name=shard-$i-of-$k
        step "$name-collect" python3 -m pytest --co -q -p no:cacheprovider -m gpu "${GPU_SUITE[@]}"
        awk -v k="$k" -v i="$i" '/^tests\/[^ ]+::[^ ]+$/ { if (n++ % k == i - 1) print }' \
          "$OUT/$name-collect.log" >"$OUT/$name.txt"
      fi
      mapfile -t ids <"$OUT/$name.txt"
      if [ ${#ids[@]} -eq 0 ]; then echo "=== $name: skipped: no test ids (see $OUT/$name*.log)"; continue; fi
      # pytest reads the ids from the file (@FILE, pytest >= 8.2): the console gets one line, not 400 ids
      step "$name" timeout "$(seconds_left "$t0" "${LIMIT:-585}" "${RERUN_S:-120}")" python3 -m pytest \
        -p no:cacheprovider -v -rfE -n "${N:-12}" --timeout 300 "@$OUT/$name.txt"
      result_ids "$OUT/$name.txt" "$OUT/$name.log" failed >"$OUT/$name-failed.txt"
      result_ids "$OUT/$name.txt" "$OUT/$name.log" notrun >"$OUT/$name-notrun.txt"
      mapfile -t failed <"$OUT/$name-failed.txt"
      echo "=== $name: ${#ids[@]} ids, ${#failed[@]} failed or errored, $(wc -l <"$OUT/$name-notrun.txt") without a result"
      : >"$OUT/$name-still-failed.txt"
      if [ ${#failed[@]} -gt 0 ]; then
        printf '%s\n' "${failed[@]}" >"$OUT/$name-rerun.txt"
        step "$name-rerun" timeout "$(seconds_left "$t0" "${LIMIT:-585}" 0)" python3 -m pytest -p no:cacheprovider \
          -v -rfE -n 2 --timeout 300 "@$OUT/$name-rerun.txt"
        result_ids "$OUT/$name-rerun.txt" "$OUT/$name-rerun.log" unpassed >"$OUT/$name-still-failed.txt"
        echo "=== $name-rerun: $(wc -l <"$OUT/$name-still-failed.txt") of ${#failed[@]} failed again on 2 workers or got no result"
      fi ;;
    caches)
      step "caches-save" timeout "${SAVE_S:-120}" python3 tools/gpu_bundle/run_on_device.py caches save \
        --name "${CACHE_NAME:-suite}" --out "$OUT" --cache-max-chunks "${CACHE_CHUNKS:-1}" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/gpu.csv" 2>&1
