"""The toolchain check: compilers ahead of the driver are named with the wheel to pin."""

from __future__ import annotations

import pytest

from moonvit_kernels.cuda_backend import toolchain


def test_a_compiler_of_a_newer_major_than_the_driver_is_a_hard_problem():
    problems = toolchain.compatibility_problems(
        {"driver": (13, 0), "nvrtc": (13, 0), "nvvm": (14, 1), "nvjitlink": None}
    )
    assert len(problems) == 1
    assert "nvvm 14.1 is newer than the driver (CUDA 13.0)" in problems[0] and "nvidia-nvvm==13.0.*" in problems[0]


def test_a_newer_minor_ptx_emitter_is_flagged_with_the_pin():
    problems = toolchain.compatibility_problems(
        {"driver": (13, 0), "nvrtc": (13, 2), "nvvm": (13, 0), "nvjitlink": (13, 2)}
    )
    assert len(problems) == 1 and "nvrtc 13.2" in problems[0] and "nvidia-cuda-nvrtc==13.0.*" in problems[0]


def test_without_a_driver_nothing_is_compared():
    assert toolchain.compatibility_problems({"driver": None, "nvrtc": (99, 0)}) == []


def test_check_raises_only_for_hard_problems(monkeypatch):
    monkeypatch.setattr(toolchain, "toolchain_versions", lambda: {"driver": (12, 8), "nvrtc": (13, 0), "nvvm": None})
    with pytest.raises(RuntimeError, match=r"nvrtc 13.0 is newer than the driver \(CUDA 12.8\)"):
        toolchain.check_toolchain()
    monkeypatch.setattr(toolchain, "toolchain_versions", lambda: {"driver": (13, 0), "nvrtc": (13, 1)})
    toolchain.check_toolchain()


def test_versions_are_read_here_without_a_driver():
    v = toolchain.toolchain_versions()
    assert set(v) == {"driver", "nvrtc", "nvvm", "nvjitlink"}
    assert all(x is None or isinstance(x, (tuple, str)) for x in v.values())
