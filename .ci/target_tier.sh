#!/usr/bin/env bash
# The target-environment tier: a venv with a CUDA image's package set (Python 3.12, numpy 2.5, the newest
# numba / numba-cuda, cupy-cuda13x 14, cuda-bindings 13, the CUDA 13.0 NVRTC / nvJitLink / NVVM / runtime / cccl
# wheels a driver-580 machine accepts, numba-cuda-mlir; no threadpoolctl, jupytext, nbclient, ipykernel, ray),
# the package installed into it offline as a CUDA machine would (--no-index --no-build-isolation), then
# tests/target. `.ci/run` calls `target_tier.sh install` beside the main suite (it is mostly downloads) and
# `target_tier.sh test` after it; with no argument both run. Each phase prints its time.
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
rm -rf .venv-target
"$py" -m venv .venv-target
# shellcheck disable=SC1091
. .venv-target/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet \
  "numpy==2.5.*" "numba>=0.68" "numba-cuda==0.30.*" "cuda-bindings==13.*" cuda-core cuda-pathfinder \
  "cupy-cuda13x==14.*" "nvidia-cuda-nvrtc==13.0.*" "nvidia-nvjitlink==13.0.*" "nvidia-nvvm==13.0.*" \
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" "numba-cuda-mlir==0.6.*" \
  "safetensors>=0.8" ml-dtypes matplotlib scipy pillow tqdm pytest pytest-xdist pytest-timeout setuptools wheel
python -m pip install --quiet --no-index --no-build-isolation -e .
python -m pip list 2>/dev/null | grep -iE "^(numpy|numba|numba-cuda|numba-cuda-mlir|cupy-cuda13x|cuda-bindings|nvidia-cuda-nvrtc|nvidia-nvjitlink|nvidia-nvvm) " || true
echo "+ target tier installed in $(( $(date +%s) - start )) s"
fi
if [ "$phase" = test ] || [ "$phase" = all ]; then
# shellcheck disable=SC1091
. .venv-target/bin/activate
# two workers, one xdist scope per module or class: the numba builds, the NVRTC builds and gpu_check run side by side
MOONVIT_TARGET_TIER=1 python -m pytest -p no:cacheprovider -o addopts="" -n 2 --dist loadscope --timeout=900 -rs -q -m target tests/target
echo "+ target tier tests done in $(( $(date +%s) - start )) s"
fi
