"""The package builds with its in-tree backend and imports from the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "_build"))

import backend  # noqa: E402


def test_wheel_holds_the_package_and_imports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    name = backend.build_wheel(str(tmp_path))
    whl = os.path.join(tmp_path, name)
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        assert {"sluice_agent/__init__.py", "sluice_agent/py.typed", "sluice_agent-0.1.0.dist-info/RECORD"} <= names
        z.extractall(tmp_path / "site")
    out = subprocess.run([sys.executable, "-c", "import sluice_agent, sys; print(sluice_agent.__file__)"],
                         cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith(str(tmp_path / "site"))
    assert backend.build_sdist(str(tmp_path)).endswith(".tar.gz")
