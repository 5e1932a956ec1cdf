#!/usr/bin/env bash
# #20 proof: SmolLM2-135M teacher-forced accuracy through the project's kernels on the GPU (2K and 4K windows)
set -u
T0=$SECONDS
A=<scratch>/acc; mkdir -p $A
[ -d <scratch>/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target <scratch>/dep .gpu/pydantic*.whl .gpu/annotated_types*.whl .gpu/typing_inspection*.whl || exit 1
P0=<scratch>/smol.tar.xz.00; [ -f $P0 ] || P0=.gpu/acc/acc1/smol.tar.xz.00; cat $P0 .gpu/acc/acc2/smol.tar.xz.01 | xz -d | tar xf - -C $A || exit 1
python3 -m pip install -q --no-index --no-deps --target <scratch>/gguf .gpu/acc/acc2/gguf-0.19.0-py3-none-any.whl || exit 1
export PYTHONPATH=$PWD:<scratch>/dep:$A:<scratch>/gguf PYTHONUNBUFFERED=1
python3 -c "import transformers, torch, triton; print('transformers', transformers.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
echo "t=$((SECONDS-T0))"
F=bf16,fp8,nvfp4,nvfp4_4over6,rotated,rotated_4over6
timeout 200 python3 -m nvfp4compat.accuracy --device cuda --codec attention --formats $F --window 2048 --windows 2 --json $OUT/acc-attention-2k.json > $OUT/acc-attention-2k.log 2>&1; echo "2k rc=$?"; tail -12 $OUT/acc-attention-2k.log
echo "t=$((SECONDS-T0))"
timeout 150 python3 -m nvfp4compat.accuracy --device cuda --codec attention --formats $F --window 4096 --windows 1 --json $OUT/acc-attention-4k.json > $OUT/acc-attention-4k.log 2>&1; echo "4k rc=$?"; tail -12 $OUT/acc-attention-4k.log
echo "t=$((SECONDS-T0))"
