"""The package's types: its stubs match the compiled module (mypy's stubtest), and the package
type-checks under ``mypy --strict`` as users' type checkers see it (``py.typed``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def mypy(tmp_path: Path, *args: str) -> None:
    # Run from an empty directory, with a cache of its own: nothing of the sources' tree shadows
    # the installed package.
    out = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, f"{' '.join(args)}:\n{out.stdout}\n{out.stderr}"


def test_stubs_match_the_compiled_module(tmp_path: Path) -> None:
    mypy(tmp_path, "mypy.stubtest", "leasehold._native")


def test_the_package_type_checks_strictly(tmp_path: Path) -> None:
    mypy(tmp_path, "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "-p", "leasehold")
