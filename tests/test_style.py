"""ruff lint and format checks run as part of the single test command."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    cmd = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")])
def test_ruff(args):
    r = _ruff(*args)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_repository_does_not_point_outside_itself():
    """The model is defined in docs/model.md: no tracked file refers to the project's private notes."""
    import re

    this = str(Path(__file__).relative_to(ROOT))
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    pattern = re.compile(r"\.\./shared|SPEC\.md|GUIDE\.md|\bSPEC( §|'s\b)|/work/shared")
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix in (".png", ".npz", ".safetensors", ".jpg", ".parquet") or not path.is_file() or name == this:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="ignore").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{name}:{n}: {line.strip()[:100]}")
    assert not offenders, "refers to notes outside the repository:\n" + "\n".join(offenders)
