"""Named source regions (`// region: NAME` … `// endregion`, `# region:` in Python): what the notebooks show."""

import re
from pathlib import Path

import pytest

from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.numba_backend import _cuda
from moonvit_kernels.source_regions import region, regions

ROOT = Path(__file__).resolve().parents[1]


def test_nested_regions_leave_out_every_marker(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(
        "#include <x>\n// region: outer\nint a;\n  // region: inner\nint b;\n  // endregion\n"
        "int c;\n// endregion\nint d;\n"
    )
    assert regions(src) == {"inner": (5, 5), "outer": (3, 7)}
    assert region(src, "outer") == "int a;\nint b;\nint c;"
    assert region(src, "inner") == "int b;"


def test_python_markers_and_modules(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("x = 1\n# region: body\ndef f():\n    return 2\n# endregion\n")
    assert region(src, "body") == "def f():\n    return 2"
    assert region(str(src), "body") == region(src, "body")
    assert "COMPILER = select_compiler()" in region(_cuda, "import_point")  # a module: its __file__


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\n// endregion\n", r"k\.cu:2: endregion without a region"),
        ("// region: one\na\n", r"k\.cu:1: region 'one' is never closed"),
        ("// region: one\n// endregion\n// region: one\n// endregion\n", r"k\.cu:3: region 'one' is defined twice"),
    ],
)
def test_broken_markers_are_named(tmp_path, text, message):
    src = tmp_path / "k.cu"
    src.write_text(text)
    with pytest.raises(ValueError, match=message):
        region(src, "one")


def test_a_missing_region_names_the_file_and_the_regions_it_has(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("// region: b\n1\n// endregion\n// region: a\n2\n// endregion\n")
    with pytest.raises(ValueError, match=r"k\.cu: no region 'kernel' \(its regions: a, b\)"):
        region(src, "kernel")
    (tmp_path / "plain.cu").write_text("int x;\n")
    with pytest.raises(ValueError, match=r"plain\.cu: no region 'x' \(its regions: none\)"):
        region(tmp_path / "plain.cu", "x")


def test_a_module_without_a_file_is_refused():
    import types

    with pytest.raises(ValueError, match="module fake has no source file"):
        region(types.ModuleType("fake"), "x")


@pytest.mark.parametrize(
    "path, name, first, last",
    [
        (KERNEL_DIR / "gemm_fp32.cu", "kernel", "namespace gemm_fp32_cfg {", "}"),
        (KERNEL_DIR / "gemm_bf16.cu", "kernel", "namespace gemm_bf16_cfg {", "}"),
        (KERNEL_DIR / "common.cuh", "reductions", "__device__ __forceinline__ float warp_sum(float v) {", "}"),
        (Path(_cuda.__file__), "import_point", "COMPILER = select_compiler()", "    import_numba_cuda_arrayobj()"),
    ],
)
def test_the_regions_the_notebooks_show(path, name, first, last):
    lines = region(path, name).splitlines()
    assert lines[0] == first and lines[-1] == last
    if name == "reductions":
        assert sum(line.startswith("__device__") for line in lines) == 3  # warp_sum, warp_max, block_sum


def test_notebooks_cut_no_source_by_string_index():
    for path in sorted((ROOT / "notebooks").glob("0[129]_*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\w+\[\w+\.index\(", text), f"{path.name} cuts a source with .index(): use region()"
        assert "region(" in text, path.name
