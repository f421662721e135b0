"""Packaging: every import is declared and every declared dependency used, extras keep the base
install free of CUDA wheels, pyproject.toml and environment.yml agree, README and CI agree."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SELF = PROJECT["name"]

# import name -> the distributions that provide it (any one of them declared is enough)
IMPORT_TO_DIST = {
    "numpy": {"numpy"},
    "scipy": {"scipy"},
    "numba": {"numba"},
    "numba.cuda": {"numba-cuda"},
    "numba_cuda_mlir": {"numba-cuda-mlir"},
    "cuda.bindings": {"cuda-bindings"},
    "cuda.pathfinder": {"cuda-pathfinder"},
    "safetensors": {"safetensors"},
    "ml_dtypes": {"ml-dtypes"},
    "matplotlib": {"matplotlib"},
    "PIL": {"pillow"},
    "tqdm": {"tqdm"},
    "threadpoolctl": {"threadpoolctl"},
    "cupy": {"cupy-cuda12x", "cupy-cuda13x"},
    "cupyx": {"cupy-cuda12x", "cupy-cuda13x"},
    "torch": {"torch"},
    "ray": {"ray"},
    "pyarrow": {"pyarrow"},
    "ipywidgets": {"ipywidgets"},  # the notebooks' optional explorers
    "fsspec": {"fsspec"},
    "aiohttp": {"aiohttp"},  # fetch's session limits (hub._client_timeout)
    "huggingface_hub": {"huggingface_hub", "huggingface-hub"},
    "pytest": {"pytest"},
    "nbformat": {"nbformat"},
    "nbclient": {"nbclient"},
    "quickjs": {"quickjs"},  # runs the script of rope --html's page
    "jupyter_client": {"jupyter_client", "jupyter-client"},
    "jupytext": {"jupytext"},
    "IPython": {"ipython"},
    "nvidia": {"nvidia-cuda-nvdisasm"},  # tools/xray/sass.py finds the nvdisasm program in the nvidia namespace
}
# distributions used as programs or plugins, not imported: (file, text that shows the use)
TOOLS = {
    "pytest-timeout": ("pyproject.toml", "--timeout="),
    "pytest-xdist": ("pyproject.toml", "-n auto --dist loadscope"),
    "ruff": ("tests/test_style.py", 'shutil.which("ruff")'),
    "ipykernel": ("tests/test_notebooks.py", 'kernel_name="python3"'),
    "jupyterlab": ("CONTRIBUTING.md", "in Jupyter"),
    "setuptools": ("tests/test_wheel.py", "--no-build-isolation"),  # builds the wheel (PEP 639 license: >= 77)
    # the cuda13 extra's pins: the libraries numba-cuda loads (NVVM, nvJitLink) and their release
    "nvidia-nvvm": ("moonvit_kernels/numba_backend/nvvm.py", 'load_nvidia_dynamic_lib("nvvm")'),
    "nvidia-nvjitlink": ("moonvit_kernels/numba_backend/nvvm.py", "nvjitlink.version()"),
    "cuda-toolkit": ("pyproject.toml", '"cuda-toolkit[nvvm,nvrtc,nvjitlink]==13.0.*"'),
}
# the package's own modules that tests, scripts and notebooks import as top-level names
LOCAL = {SELF, "helpers", "cuda_kernel_checks", "formulations", "tiers", "compile_tier", "conftest"}
# CUDA toolchain wheels that must stay out of the base install
CUDA_WHEELS = re.compile(r"^(nvidia-|cuda-toolkit|cupy)|\[cu1[23]\]")


def dist_name(requirement: str) -> str:
    """`numba-cuda[cu13]==0.30.*` -> `numba-cuda` (lower case)."""
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()


def extra_names(requirement: str) -> set[str]:
    m = re.match(r"[A-Za-z0-9._-]+\[([^\]]+)\]", requirement)
    return {e.strip() for e in m.group(1).split(",")} if m else set()


def expand(extra: str) -> list[str]:
    """The requirements of one extra, with `moonvit_kernels[...]` self-references expanded."""
    out = []
    for req in PROJECT["optional-dependencies"][extra]:
        if dist_name(req) == SELF:
            for inner in sorted(extra_names(req)):
                out += expand(inner)
        else:
            out.append(req)
    return out


def imports(folder: str) -> dict[str, set[str]]:
    """Third-party import names used in `folder` (`numba.cuda` and `cuda.*` kept dotted) -> files,
    and, under the key prefix `toplevel:`, those imported at a module's top level."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                key = name if name.startswith(("numba.cuda", "cuda.")) else name.split(".")[0]
                key = ".".join(key.split(".")[:2]) if key.startswith(("numba.cuda", "cuda.")) else key
                if key.split(".")[0] in sys.stdlib_module_names or key.split(".")[0] in LOCAL or key == "cuda":
                    continue
                rel = str(path.relative_to(ROOT))
                found.setdefault(key, set()).add(rel)
                if id(node) in top:
                    found.setdefault(f"toplevel:{key}", set()).add(rel)
    return found


def test_every_import_is_declared():
    base = {dist_name(r) for r in PROJECT["dependencies"]}
    everything = base | {dist_name(r) for extra in PROJECT["optional-dependencies"] for r in expand(extra)}
    for folder in ("moonvit_kernels", "tests", "scripts", "benchmarks", "notebooks"):
        for name, files in imports(folder).items():
            if name.startswith("toplevel:"):
                continue
            assert name in IMPORT_TO_DIST, f"{name} (imported in {sorted(files)[0]}) has no entry in IMPORT_TO_DIST"
            assert IMPORT_TO_DIST[name] & everything, f"{name} is imported in {sorted(files)[0]} but not declared"
    # the package's top-level imports run on `import moonvit_kernels...`: they must be base dependencies
    for name, files in imports("moonvit_kernels").items():
        if name.startswith("toplevel:"):
            dists = IMPORT_TO_DIST[name.removeprefix("toplevel:")]
            assert dists & base, f"{sorted(files)[0]} imports {name[9:]} at top level, but it is not a base dependency"


def test_every_declared_dependency_is_used():
    used = {
        d
        for folder in ("moonvit_kernels", "tests", "scripts", "benchmarks", "notebooks")
        for name in imports(folder)
        if not name.startswith("toplevel:")
        for d in IMPORT_TO_DIST.get(name, ())
    }
    for file, evidence in TOOLS.values():
        assert evidence in (ROOT / file).read_text(), f"{file} no longer shows the use '{evidence}'"
    declared = {dist_name(r) for r in PROJECT["dependencies"]}
    declared |= {dist_name(r) for extra in PROJECT["optional-dependencies"] for r in expand(extra)}
    unused = sorted(declared - used - set(TOOLS))
    assert not unused, f"declared but never imported or run: {unused}"
    assert "safetensors" in used and "ml-dtypes" in used


def test_base_install_has_no_cuda_wheels_and_extras_split_by_cuda_major():
    extras = PROJECT["optional-dependencies"]
    heavy = [r for r in PROJECT["dependencies"] if CUDA_WHEELS.search(r)]
    assert not heavy, f"CUDA wheels in the base install: {heavy}"
    assert any("numba-cuda[cu13]" in r for r in expand("compile"))
    assert f"{SELF}[test,compile]" in extras["dev"] or any(
        dist_name(r) == SELF and {"compile"} <= extra_names(r) for r in extras["dev"]
    )
    assert {dist_name(r) for r in extras["cuda12"]} == {"cupy-cuda12x", "numba-cuda"}
    assert any("[cu12]" in r for r in extras["cuda12"]) and any("[cu13]" in r for r in extras["cuda13"])
    assert {dist_name(r) for r in extras["cuda13"]} == {
        "cupy-cuda13x", "numba-cuda", "cuda-toolkit", "nvidia-nvvm", "nvidia-nvjitlink"
    }  # fmt: skip


def test_the_cuda13_extra_pins_nvvm_to_the_release_of_its_nvjitlink():
    """numba-cuda[cu13] alone resolves the newest NVVM, whose PTX an older nvJitLink cannot link (nvvm.py): the
    extra pins NVVM, nvJitLink and the toolkit's NVRTC to one release."""
    pins = {dist_name(r): r.split("==", 1)[1] for r in PROJECT["optional-dependencies"]["cuda13"] if "==" in r}
    assert pins.get("nvidia-nvvm") == pins.get("nvidia-nvjitlink") == pins.get("cuda-toolkit") == "13.0.*", pins


def _env_pip_lines() -> list[str]:
    """The entries under `- pip:` (6-space indented list items)."""
    lines = []
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^      - (\S.*)$", line)
        if m and m.group(1) != "-e .":
            lines.append(m.group(1).strip())
    return lines


def test_environment_matches_pyproject():
    wanted = list(PROJECT["dependencies"]) + expand("dev")
    got = _env_pip_lines()
    assert len(got) == len(set(got)), "environment.yml lists a dependency twice"
    assert set(got) == set(wanted)


def test_readme_has_the_three_commands_and_ci_reads_them():
    readme = (ROOT / "README.md").read_text()
    for tag in ("install", "test", "run"):
        assert re.search(rf"^\S.*[^ ] +# {tag}$", readme, re.M), f"README lacks its '# {tag}' line"
    install = re.search(r"^(\S.*[^ ]) +# install$", readme, re.M).group(1)
    assert ".[dev]" in install, "the README's install command must bring the test tools (the dev extra)"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "# install$" in ci and "# test$" in ci


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_package_list_names_every_package_folder_and_the_bundled_data():
    code = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "moonvit_kernels").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    data = {"moonvit_kernels.data"} | {
        f"moonvit_kernels.data.{d.name}" for d in (ROOT / "data").iterdir() if d.is_dir() and d.name != "__pycache__"
    }
    assert {"moonvit_kernels.data.tiny", "moonvit_kernels.data.photo", "moonvit_kernels.data.golden_tiny"} <= data
    assert sorted(SETUPTOOLS["packages"]) == sorted(code | data)
    assert SETUPTOOLS["package-dir"] == {"moonvit_kernels.data": "data"}
    assert (ROOT / "data" / "__init__.py").is_file() and not (ROOT / "moonvit_kernels" / "data").exists()
    shipped = SETUPTOOLS["package-data"]
    assert all(shipped.get(name) == ["*"] for name in data - {"moonvit_kernels.data"})
