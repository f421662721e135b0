"""Process pools start by spawn: nothing forks from a threaded process (a forked child can inherit a held
import lock and wait forever: `python -m moonvit_kernels.tools.xray` hung that way on a cold cache)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from moonvit_kernels.tools import nvrtc_check


def test_the_compile_pools_use_spawn(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, max_workers=None, mp_context=None):
            seen.append(mp_context.get_start_method() if mp_context else "default (fork on Linux)")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, jobs):
            return []

    monkeypatch.setattr(nvrtc_check, "ProcessPoolExecutor", Recorder)
    monkeypatch.setattr(nvrtc_check.registry, "specs_for", lambda arch, head_dims=(128,): [object(), object()])
    nvrtc_check.build_cubins("sm_90", (24,), workers=2)
    assert seen == ["spawn"]


@pytest.mark.compile
@pytest.mark.timeout(300)
def test_building_cubins_from_a_thread_while_another_imports_finishes():
    """The X-ray's situation: a worker thread starts the NVRTC pool while the main thread imports modules."""
    code = textwrap.dedent(
        """
        import importlib, sys
        from concurrent.futures import ThreadPoolExecutor
        from moonvit_kernels import registry
        from moonvit_kernels.tools import nvrtc_check
        one = [s for s in registry.specs_for("sm_90", (24,)) if s.source == "rmsnorm.cu"][:2]
        registry.specs_for = lambda arch, head_dims=(128,): one
        with ThreadPoolExecutor(max_workers=1) as pool:
            fut = pool.submit(nvrtc_check.build_cubins, "sm_90", (24,), 2)
            for name in ("moonvit_kernels.tools.xray.report", "moonvit_kernels.tools.xray.roofline", "email.mime.text"):
                importlib.import_module(name)
            built = fut.result(timeout=240)
        print(len(built), all(r.ok for _, _, r in built))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["2", "True"], r.stdout
