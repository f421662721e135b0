"""Caches of loadable code (compile_cache's cubins, the emulator's shared libraries, the unpacked NVVM) against a
second local account: a real user made with `useradd` plays the attacker in a shared sticky temp dir (as /tmp is),
squatting the victim's cache root, pointing it at folders by symbolic link and flipping that link while the victim
loads. Needs root (to make the user and run as it); skipped otherwise."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest

from moonvit_kernels import compile_cache, private_dirs

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("useradd", "userdel")
ATTACKER_PATH = "/usr/bin:/bin"
TINY = {"unit.cpp": 'extern "C" int answer() { return 42; }\n'}
STANDINS = ("prelude.h", "cuda_bf16.h")
EVIL = (  # the attacker's library: its constructor leaves a mark where $MVK_MARKER says
    "#include <cstdio>\n#include <cstdlib>\n"
    'extern "C" int answer() { return 666; }\n'
    "__attribute__((constructor)) static void pwn() {\n"
    '  if (const char* m = std::getenv("MVK_MARKER")) std::fclose(std::fopen(m, "w"));\n'
    "}\n"
)

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
    reason="plays a second local account: needs root and useradd/userdel to create it",
)


class Attacker:
    """A second local user; `run` executes a shell script as it."""

    def __init__(self, name: str):
        import pwd

        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def _args(self, script: str) -> dict:
        return dict(args=["sh", "-c", script], user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                    env={"PATH": ATTACKER_PATH})  # fmt: skip

    def run(self, script: str) -> None:
        subprocess.run(**self._args(script), check=True, timeout=60)

    def flip(self, link: Path, one: Path, other: Path) -> subprocess.Popen:
        """Start pointing `link` at `one` and `other` in turn, each swap atomic (a new link renamed over it), as
        fast as the system's Python goes (else `ln` in a shell loop); `stop` it."""
        spare = link.with_name(link.name + ".next")
        code = (f"import os\nwhile True:\n    for t in ({str(one)!r}, {str(other)!r}):\n"
                f"        os.symlink(t, {str(spare)!r}); os.replace({str(spare)!r}, {str(link)!r})\n")  # fmt: skip
        python = shutil.which("python3", path=ATTACKER_PATH)  # one the attacker can run (not a venv under /root)
        args = self._args(f"while :; do ln -sfn '{one}' '{link}'; ln -sfn '{other}' '{link}'; done")
        if python:
            args["args"] = [python, "-I", "-c", code]
        return subprocess.Popen(**args, start_new_session=True, stderr=subprocess.DEVNULL)

    @staticmethod
    def stop(flipper: subprocess.Popen) -> None:
        """End the flipper and everything it started (an `ln` left running would make a link after cleanup)."""
        os.killpg(flipper.pid, signal.SIGKILL)
        flipper.wait()


@pytest.fixture(scope="module")
def attacker():
    name = f"mvk{uuid.uuid4().hex[:10]}"
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a second user to play the attacker: {made.stderr.decode().strip()}")
    try:
        yield Attacker(name)
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared(monkeypatch, tmp_path):
    """A sticky world-writable temp dir (like /tmp) as the victim's only usable cache place: its cache home
    is unusable (below a file)."""
    place = Path(tempfile.mkdtemp(dir="/tmp", prefix="mvk_shared_"))
    place.chmod(0o1777)
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a file" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(place))
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    yield place
    shutil.rmtree(place, ignore_errors=True)


def victim_root(shared: Path) -> Path:
    return shared / f"moonvit_kernels-{os.getuid()}"


def own_private_folder(tmp_path: Path) -> Path:
    """A folder of the victim's that passes an owner check (what the attacker points a link at)."""
    mine = tmp_path / "victims_own"
    mine.mkdir(mode=0o700)
    return mine


def entry_bytes(header: dict, cubin: bytes) -> bytes:
    """A compile-cache entry as `compile_cache.store` writes it (digest and all): the attacker knows the format."""
    import hashlib

    text = json.dumps(header).encode()
    body = compile_cache._HEADER.pack(len(text)) + text + cubin
    return hashlib.sha256(body).digest() + body


def plant_compile_entry(attacker: Attacker, shared: Path, where: Path, name: str) -> None:
    """`where`/compile/`name` (folders the attacker makes) holds a planted cubin."""
    src = shared / "planted_entry"
    src.write_bytes(entry_bytes({"log": "planted"}, b"attacker's cubin"))
    src.chmod(0o644)
    attacker.run(f"mkdir -p '{where}/compile' && cp '{src}' '{where}/compile/{name}'")


def test_a_squatted_root_is_refused_by_every_cache(attacker, shared, tmp_path):
    root = victim_root(shared)
    theirs = f"{re.escape(str(root))} belongs to user id {attacker.uid}"
    name = compile_cache.key("t", ["x"])
    plant_compile_entry(attacker, shared, root, name)
    with pytest.warns(RuntimeWarning, match=f"{theirs}.*Fix: remove it"):
        assert compile_cache.load(name) is None
    with pytest.warns(RuntimeWarning):
        compile_cache.store(compile_cache.key("t", ["y"]), {}, b"mine")
    assert sorted(p.name for p in (root / "compile").iterdir()) == [name]

    from moonvit_kernels.tools.emulation import build

    with pytest.raises(private_dirs.UnsafeFolder, match=theirs) as e:
        build.build_library(TINY, "unit.cpp", standins=STANDINS, tag="squat")
    assert not isinstance(e.value, RuntimeError)  # not "the source does not compile" for an exercise
    assert "XDG_CACHE_HOME or TMPDIR" in str(e.value)

    from moonvit_kernels.numba_backend import nvvm

    prepared = tmp_path / "toolchain"
    prepared.mkdir()
    manifest = {"version": "0", "archive": "a.tar.xz", "archive_sha256": "0" * 64, "files": {}}
    (prepared / nvvm.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(nvvm.NvvmUnavailable, match=theirs):
        nvvm.unpack_prepared(prepared)


def test_a_root_that_is_a_link_is_refused_even_to_the_victims_own_folder(attacker, shared, tmp_path):
    root = victim_root(shared)
    attacker.run(f"ln -s '{own_private_folder(tmp_path)}' '{root}'")
    with pytest.raises(private_dirs.UnsafeFolder, match=f"{re.escape(str(root))} is a symbolic link"):
        private_dirs.root()
    from moonvit_kernels.tools.emulation import build

    with pytest.raises(private_dirs.UnsafeFolder, match="symbolic link"):
        build.build_library(TINY, "unit.cpp", standins=STANDINS, tag="link")
    assert not (tmp_path / "victims_own" / "emulator").exists()  # nothing built (or .lock truncated) there


def test_a_cache_home_in_a_folder_the_attacker_owns_is_passed_over(attacker, shared, tmp_path, monkeypatch):
    home = shared / "attackers_home"
    attacker.run(f"mkdir -m 755 '{home}'")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    assert private_dirs.root() == victim_root(shared)  # the temp dir, not inside the attacker's folder
    assert not (home / private_dirs.ROOT_NAME).exists()


def test_flipping_a_link_never_serves_the_attackers_cubin(attacker, shared, tmp_path):
    """The attack of issue 31: the root flips between a folder of the victim's and one of the attacker's."""
    root = victim_root(shared)
    name = compile_cache.key("t", ["flip"])
    theirs = shared / "attackers"
    plant_compile_entry(attacker, shared, theirs, name)
    mine = own_private_folder(tmp_path)
    (mine / "compile").mkdir(mode=0o700)
    (mine / "compile" / name).write_bytes(entry_bytes({"log": "mine"}, b"victim's cubin"))
    flipper = attacker.flip(root, mine, theirs)
    got, end = [], time.monotonic() + 1.5
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # each refusal warns
            while time.monotonic() < end:
                got.append(compile_cache.load(name))
    finally:
        attacker.stop(flipper)
    assert len(got) > 100 and all(g is None for g in got), [g for g in got if g is not None][:1]


def test_flipping_a_link_never_loads_the_attackers_library(attacker, shared, tmp_path):
    """The attacker's library (a constructor that leaves a mark) sits where the victim's would, with a matching
    digest beside it; the root flips between the victim's own folder and the attacker's."""
    from moonvit_kernels.tools.emulation import build

    if build.compiler() is None:
        pytest.skip("no C++ compiler")
    lib = build.build_library(TINY, "unit.cpp", standins=STANDINS, tag="flip")  # where it goes, and its digest
    inside = lib.relative_to(victim_root(shared))
    evil = shared / "evil.so"
    subprocess.run([build.compiler(), "-shared", "-fPIC", "-x", "c++", "-", "-o", str(evil)], input=EVIL, text=True,
                   check=True)  # fmt: skip
    (shared / "evil.sha256").write_text(private_dirs.sha256_of(evil) + "\n")
    for p in (evil, shared / "evil.sha256"):
        p.chmod(0o644)
    theirs = shared / "attackers"
    attacker.run(f"mkdir -p '{theirs / inside.parent}' && cp '{evil}' '{theirs / inside}' && "
                 f"cp '{shared / 'evil.sha256'}' '{theirs / inside}.sha256'")  # fmt: skip
    mine = own_private_folder(tmp_path)
    shutil.copytree(victim_root(shared) / "emulator", mine / "emulator")
    shutil.rmtree(victim_root(shared))
    marker = tmp_path / "constructor ran"
    code = (
        "from moonvit_kernels import private_dirs\nfrom moonvit_kernels.tools.emulation import build\n"
        f"files, answers = {TINY!r}, set()\n"
        "for _ in range(300):\n"
        "    try:\n"
        f"        answers.add(build.load(build.build_library(files, 'unit.cpp', standins={STANDINS!r}, tag='flip'))"
        ".answer())\n"
        "    except private_dirs.UnsafeFolder:\n"
        "        pass\n"
        "print(sorted(answers))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MVK_MARKER": str(marker), "TMPDIR": str(shared),
           "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}  # fmt: skip
    flipper = attacker.flip(victim_root(shared), mine, theirs)
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    finally:
        attacker.stop(flipper)
    assert not marker.exists(), "the attacker's library constructor ran in the victim's process"
    assert r.returncode == 0 and "666" not in r.stdout, r.stdout + r.stderr[-2000:]


def test_a_truncated_library_is_rebuilt_not_loaded(tmp_path):
    """Finding 8: dlopen of a truncated cached library is a Bus error; the digest check rebuilds it instead."""
    from moonvit_kernels.tools.emulation import build

    if build.compiler() is None:
        pytest.skip("no C++ compiler")
    code = (
        "import os, sys\nfrom moonvit_kernels.tools.emulation import build\n"
        f"lib = build.build_library({TINY!r}, 'unit.cpp', standins={STANDINS!r}, tag='truncated')\n"
        "if sys.argv[1] == 'cut':\n    os.truncate(lib, 1000)\n"
        "else:\n    print(build.load(lib).answer())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    for step in ("cut", "load"):
        r = subprocess.run([sys.executable, "-c", code, step], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{step}: rc {r.returncode}\n{r.stderr[-2000:]}"
    assert r.stdout.strip() == "42"
