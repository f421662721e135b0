#!/usr/bin/env bash
# The target-environment tier: a venv holding the GPU machine's package set and nothing it lacks
# (.ci/target_requirements.txt, every name from the image's list .ci/target_image.txt: Python 3.12, numpy 2.5,
# numba 0.68 + numba-cuda 0.30, cupy-cuda13x 14.2, cuda-bindings 13, CUDA 13.0 NVRTC / nvJitLink / runtime; no
# nvidia-nvvm, no cccl, no numba-cuda-mlir, no jupyter or ray), then tests/target, run as the GPU session runs:
# from the source tree (PYTHONPATH, the package not installed) with no network and, as on the image, no NVVM: a
# system one on this machine is hidden (mount and network namespaces: `unshare -m -n`, as root), and the NVVMs the tests
# switch between are prepared by scripts/prepare_nvvm.py into .ci-nvvm/: 13.0 (the one the GPU session brings)
# and the newest 13.x (newer than nvJitLink 13.0). `.ci/run` calls `target_tier.sh install` beside the main suite
# and `target_tier.sh test` after it; with no argument both run. Each phase prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
start=$(date +%s)
if [ "$phase" = install ] || [ "$phase" = all ]; then
py=""
# a pyenv install first (its shim for python3.12 may exist yet refuse to run), then whatever python3.12 is on PATH
for cand in $(command -v pyenv >/dev/null 2>&1 && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null) \
  "$(command -v python3.12 || true)"; do
  if [ -n "$cand" ] && "$cand" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
[ -n "$py" ] || { echo "target tier: no Python 3.12 on this machine" >&2; exit 1; }
echo "+ target tier with $py"
rm -rf .venv-target .ci-nvvm
"$py" -m venv .venv-target
# shellcheck disable=SC1091
. .venv-target/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -r .ci/target_requirements.txt
# the two NVVMs the tests switch between (fast xz presets: these never travel)
python scripts/prepare_nvvm.py --version 13.0 --preset 1 --out .ci-nvvm/13.0
python scripts/prepare_nvvm.py --version 13 --preset 0 --out .ci-nvvm/newest
python -m pip list 2>/dev/null | grep -iE "^(numpy|numba|numba-cuda|cupy-cuda13x|cuda-bindings|nvidia-cuda-nvrtc|nvidia-nvjitlink|nvidia-nvvm) " || true
echo "+ target tier installed in $(( $(date +%s) - start )) s"
fi
if [ "$phase" = test ] || [ "$phase" = all ]; then
# shellcheck disable=SC1091
. .venv-target/bin/activate
# two workers, one xdist scope per module or class: the numba builds, the NVRTC builds and gpu_check run side by side
run_tests=(env MOONVIT_TARGET_TIER=1 MOONVIT_CI_NVVM="$PWD/.ci-nvvm" PYTHONPATH="$PWD" python -m pytest -p no:cacheprovider -o addopts=""
  -n 2 --dist loadscope --timeout=900 -rs -q -m target tests/target)
# where this machine has an NVVM of its own (the image has none), hide it: a tmpfs over each folder holding one
hide=$( (ldconfig -p 2>/dev/null | sed -n 's/.*libnvvm\.so.* => \(.*\)/\1/p' | xargs -r -n1 dirname;
         ls -d /usr/local/cuda*/nvvm /usr/local/cuda*/lib64 /usr/local/cuda*/lib 2>/dev/null) | sort -u | tr '\n' ' ')
if [ -n "$hide" ] && unshare -m -n true 2>/dev/null; then
  echo "+ no network, and this machine's own NVVM hidden: $hide"
  # shellcheck disable=SC2016
  unshare -m -n sh -c 'for d in $0; do [ -d "$d" ] && mount -t tmpfs none "$d"; done; exec "$@"' "$hide" "${run_tests[@]}"
else
  [ -n "$hide" ] && export MOONVIT_SYSTEM_NVVM_VISIBLE="$hide"  # the "no NVVM" tests skip, saying why
  "${run_tests[@]}"
fi
echo "+ target tier tests done in $(( $(date +%s) - start )) s"
fi
