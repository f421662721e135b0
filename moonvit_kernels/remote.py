"""Which checkpoint locations are remote — the one definition the package uses.

`hf://ORG/REPO[@REVISION]`, `http://…` and `https://…` are remote: `checkpoints.load_checkpoint` has
`hub` fetch their vision tensors into a cache folder first. Anything else (a `str` without one of those
schemes, any `os.PathLike`) is a local path.
"""

from __future__ import annotations

import os
import re

REMOTE_SCHEMES = ("hf", "http", "https")
_REMOTE = re.compile("^(?:" + "|".join(REMOTE_SCHEMES) + ")://")


def is_remote(source: str | os.PathLike) -> bool:
    """True for `hf://…`, `http://…` and `https://…` strings; False for local paths and path objects."""
    return isinstance(source, str) and _REMOTE.match(source) is not None
