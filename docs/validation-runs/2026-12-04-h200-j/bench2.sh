#!/usr/bin/env bash
# run J (second machine) background job: the decode benchmark with the new head_dim-128 default (byte scales, 168-register
# cap, merge steps of 2048) against the shipped ac2d392 kernel (--baseline) and FlashInfer 0.7.2.post1 in one run
source "$(dirname "$0")/common.sh"
R=$S/repo; rm -rf $R; mkdir -p $R $S/fi $S/dep
tar --exclude=./.bundle --exclude=./.gpu -cf - . | tar -xf - -C $R; cp .gpu/att_baseline.py $S/att_baseline.py
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl
cd $R; export PYTHONPATH=$R:$S/dep:$S/fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import flashinfer, torch, triton, tvm_ffi; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'tvm_ffi', tvm_ffi.__version__)"
echo "[$((SECONDS-T0))] bench"
timeout 600 python3 benchmarks/bench_attention.py --no-sweep --baseline $S/att_baseline.py \
  --shapes "decode 16 x 16K,decode 128 x 2K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 4 x 32K,decode 32 x 8K" \
  --json $S/out/bench_decode_new.json > $S/logs/bench-decode-new.log 2>&1
echo "[$((SECONDS-T0))] bench rc=$?"
echo "[$((SECONDS-T0))] done"
