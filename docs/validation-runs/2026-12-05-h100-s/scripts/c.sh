#!/usr/bin/env bash
# call C (s21): one third of the GPU attention suite (tests/kernels/test_gpu_attention.py and test_gpu_decode_gluon.py,
# 1,203 ids as collected on the CPU, split round-robin into .gpu/s21/suite-{1,2,3}.txt) over N xdist workers (the time is Triton
# compiles, ~8 s a test serially on the H100 of s20), each test under a 300 s limit. SHARD=1|2|3. carry: [".gpu", ".bundle/caches"]
set -u; export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a; T0=$SECONDS
S=/tmp/s21; mkdir -p $S/fi $S/dep
nvidia-smi --query-gpu=name --format=csv,noheader
[ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
[ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl 2>&1 | tail -1
[ -e $S/dated ] || { find $S/fi $S/dep -exec touch -h -d 2020-01-01 {} + && touch $S/dated; }  # see a.sh
python3 tools/gpu_bundle/run_on_device.py caches restore --site $S/state 2>&1 | tail -2
export PYTHONPATH=$PWD:$S/dep:$S/fi
set -f  # the test ids hold [...]: no globbing from here on
timeout $(( ${LIMIT:-585} - SECONDS + T0 )) python3 -m pytest -p no:cacheprovider -v -rfE -n ${N:-12} --timeout 300 \
  $(cat .gpu/s21/suite-${SHARD:-1}.txt) > $OUT/suite-${SHARD:-1}.log 2>&1; echo "suite ${SHARD:-1} rc=$?"
tail -3 $OUT/suite-${SHARD:-1}.log; grep -E "^(FAILED|ERROR)" $OUT/suite-${SHARD:-1}.log | head -20
echo "--- t=$((SECONDS-T0))"
