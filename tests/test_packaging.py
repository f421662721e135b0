"""pyproject.toml and environment.yml list the same dependencies; README and CI agree."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env_pip_lines() -> set[str]:
    """The entries under `- pip:` (6-space indented list items)."""
    lines = set()
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^      - (\S.*)$", line)
        if m and m.group(1) != "-e .":
            lines.add(m.group(1).strip())
    return lines


def test_environment_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    assert _env_pip_lines() == wanted


def test_readme_has_the_three_commands_and_ci_reads_them():
    readme = (ROOT / "README.md").read_text()
    for tag in ("install", "test", "run"):
        assert re.search(rf"^\S.*[^ ] +# {tag}$", readme, re.M), f"README lacks its '# {tag}' line"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "# install$" in ci and "# test$" in ci
