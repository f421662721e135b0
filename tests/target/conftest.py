"""The target-environment tier runs only where .ci/target_tier.sh sets MOONVIT_TARGET_TIER=1 (a venv with the GPU
image's package set, which has no NVVM); in the main suite this folder is not collected.

`.ci/target_tier.sh` prepares two NVVMs under $MOONVIT_CI_NVVM (scripts/prepare_nvvm.py): `13.0`, what the GPU
session brings (gpu_toolchain/), used by every test unless it says otherwise, and `newest` (a newer 13.x than
nvJitLink 13.0)."""

import os

if os.environ.get("MOONVIT_TARGET_TIER") != "1":
    collect_ignore_glob = ["test_*.py"]
elif os.environ.get("MOONVIT_CI_NVVM"):
    os.environ.setdefault("MOONVIT_GPU_TOOLCHAIN", os.path.join(os.environ["MOONVIT_CI_NVVM"], "13.0"))
