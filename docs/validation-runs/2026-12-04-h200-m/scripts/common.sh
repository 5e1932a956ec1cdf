# sourced by the call scripts of session 10 (run L)
set -u
export FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
S=${TMPDIR:-/tmp}/s12; mkdir -p $S/logs $S/out
export FLASHINFER_WORKSPACE_BASE=$S/fi-ws
T0=$SECONDS; ROOT=$PWD
setup() {
  R=$S/repo; rm -rf $R; mkdir -p $R $S/fi $S/dep
  tar --exclude=./.bundle --exclude=./.gpu -cf - . | tar -xf - -C $R
  [ -d $S/fi/flashinfer ] || tar -xJf .gpu/fi/fi-0.7.2.post1.tar.xz -C $S/fi
  [ -d $S/dep/pydantic ] || python3 -m pip install -q --no-index --no-deps --target $S/dep .gpu/fi/*.whl
  cd $R; export PYTHONPATH=$R:$S/dep:$S/fi
}
left() { echo $(( ${LIMIT:-585} - (SECONDS - T0) )); }
collect() { (cd $S && tar -czf $OUT/run-l.tar.gz logs out); }
