#!/usr/bin/env bash
# run J background job: decode benchmark (default, swapped-QK and byte-scale configs, the merge knob) side by side with
# FlashInfer 0.7.2.post1, then Nsight Compute counters per variant. Runs from a private copy of the checkout.
source "$(dirname "$0")/common.sh"
R=$S/repo; rm -rf $R; mkdir -p $R $S/fi $S/dep
tar --exclude=./.bundle --exclude=./.gpu -cf - . | tar -xf - -C $R
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl
cd $R; export PYTHONPATH=$R:$S/dep:$S/fi
echo "[$((SECONDS-T0))] env"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import flashinfer, torch, triton, pydantic, tvm_ffi; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'tvm_ffi', tvm_ffi.__version__)"
git -C $R log -1 --format=%h 2>/dev/null
echo "[$((SECONDS-T0))] bench"
timeout 900 python3 benchmarks/bench_attention.py \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K" \
  --variants "swapped QK,byte scales" --knob MERGE_STEP_ELEMENTS=2048 --json $S/out/bench_decode.json \
  > $S/logs/bench-decode.log 2>&1
echo "[$((SECONDS-T0))] bench rc=$?"
NCU="ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
for v in "default:" "swap0:--swap 0" "swap1:--swap 1" "swap2:--swap 2" "bytes0:--byte-scales 0"; do
  tag=${v%%:*}; arg=${v#*:}
  timeout 120 $NCU python3 benchmarks/profile_attention.py --shape "decode 16 x 16K" $arg > $S/logs/ncu-16x16K-$tag.log 2>&1
  echo "[$((SECONDS-T0))] ncu 16x16K $tag rc=$?"
done
for v in "default:" "swap0:--swap 0"; do
  tag=${v%%:*}; arg=${v#*:}
  timeout 120 $NCU python3 benchmarks/profile_attention.py --shape "decode 1 x 8K" $arg > $S/logs/ncu-1x8K-$tag.log 2>&1
  echo "[$((SECONDS-T0))] ncu 1x8K $tag rc=$?"
done
echo "[$((SECONDS-T0))] done"
