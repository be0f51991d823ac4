#!/bin/sh
# make bench-gpu, for a machine without make (the lent GPU image's package
# list does not name it): sh lab/bench_gpu.sh, from the repository's root.
# The same variables as the make target, from the environment:
#   BENCH_PYTHON (python3), BENCH_OUT (bench_results), BENCH_WHEELS (.whl),
#   BENCH_SITE (.bench-site), BENCH_FLAGS (more flags for lab/bench_gpu.py).
# A Python without Keras takes it from the wheels in BENCH_WHEELS (make
# bench-gpu-wheels, run where pip reaches an index), installed into
# BENCH_SITE first. Relative paths are taken from the repository's root.
root=$(cd "$(dirname "$0")/.." && pwd) || exit 1
python=${BENCH_PYTHON:-python3}
out=${BENCH_OUT:-bench_results}
wheels=${BENCH_WHEELS:-.whl}
site=${BENCH_SITE:-.bench-site}
cd "$root" || exit 1

keras_site=
if ! $python -c 'import importlib.util as u, sys
sys.exit(u.find_spec("keras") is None)'; then
  if ! ls "$wheels"/keras-*.whl >/dev/null 2>&1; then
    echo "bench-gpu: $python has no Keras, and $wheels/ has no Keras wheel:" \
        "run make bench-gpu-wheels on a machine that reaches a package" \
        "index, and carry $wheels/" >&2
    exit 1
  fi
  echo "Keras from $wheels/ into $site/"
  mkdir -p "$site" && site=$(cd "$site" && pwd) || exit 1
  $python -m pip install --quiet --no-index --no-deps --no-compile \
      --upgrade --target "$site" "$wheels"/*.whl || exit 1
  keras_site=$site:
fi
export PYTHONPATH="$keras_site$root${PYTHONPATH:+:$PYTHONPATH}"
export KERAS_BACKEND=jax
set -x
# BENCH_FLAGS is split into words on purpose.
# shellcheck disable=SC2086
exec $python -m lab.bench_gpu --output_dir="$out" $BENCH_FLAGS
