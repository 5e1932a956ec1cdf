#!/usr/bin/env bash
source .gpu/s12/common.sh
setup
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; uname -r
python3 -c "import flashinfer, torch, triton; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
echo "[$((SECONDS-T0))] gluon tests"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_decode_gluon.py -x --maxfail=20 > $S/logs/pytest-gluon.log 2>&1; echo "rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $S/logs/pytest-gluon.log | cut -c1-220 | tail -25
echo "[$((SECONDS-T0))] full-envelope attention tier"
timeout 110 python3 $ROOT/.gpu/s12/full_pytest.py -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_attention.py -k "not flashinfer and (decode or prefill_all or split)" > $S/logs/pytest-full-tier.log 2>&1; echo "rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" $S/logs/pytest-full-tier.log | cut -c1-220 | tail -15
echo "[$((SECONDS-T0))] bench"
timeout $(( $(left) - 15 )) python3 benchmarks/bench_attention.py --variants "e4m3_cvt=True" \
  --shapes "decode 4 x 32K,decode 32 x 8K,decode 16 x 16K,decode ragged 8 x 1K-30K,decode 1 x 8K,decode 128 x 2K" \
  --json $S/out/bench_l1.json > $S/logs/bench-l1.log 2>&1; echo "bench rc=$?"
grep -E "^## |^\| (triton NVFP4|flashinfer)" $S/logs/bench-l1.log | sed -E 's/DecodeConfig\(block_n=([0-9]+), num_warps=([0-9]+), num_stages=([0-9]), maxnreg=([A-Za-z0-9]+),[^)]*\)/\1\/\2\/\3\/\4/' | cut -c1-150
collect
echo "[$((SECONDS-T0))] done"
