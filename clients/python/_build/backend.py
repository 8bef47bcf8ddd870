"""A PEP 517 build backend in the standard library alone, so that
``pip install ./clients/python`` works where no package index is
reachable (pip installs a build backend from the index otherwise). It
builds a pure-Python wheel of sluice_agent and an sdist."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

NAME, DIST, VERSION = "sluice-agent", "sluice_agent", "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Client of sluice's local agent: one rate limit shared by every process of a fleet
Requires-Python: >=3.9
License: Apache-2.0
Description-Content-Type: text/markdown

"""

WHEEL = f"""Wheel-Version: 1.0
Generator: sluice_agent._build ({VERSION})
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _package_files() -> List[Tuple[str, bytes]]:
    out = []
    root = os.path.join(HERE, DIST)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(root, name), "rb") as f:
                out.append((f"{DIST}/{name}", f.read()))
    return out


def _readme() -> str:
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _dist_info(files: List[Tuple[str, bytes]]) -> List[Tuple[str, bytes]]:
    info = f"{DIST}-{VERSION}.dist-info"
    meta = [(f"{info}/METADATA", (METADATA + _readme()).encode()), (f"{info}/WHEEL", WHEEL.encode())]
    record = "\n".join(_record_line(p, d) for p, d in files + meta) + f"\n{info}/RECORD,,\n"
    return meta + [(f"{info}/RECORD", record.encode())]


def _zip(path: str, files: List[Tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data, zipfile.ZIP_DEFLATED)


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    name = f"{DIST}-{VERSION}-py3-none-any.whl"
    files = _package_files()
    _zip(os.path.join(wheel_directory, name), files + _dist_info(files))
    return name


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel whose .pth file puts this directory on sys.path."""
    name = f"{DIST}-{VERSION}-py3-none-any.whl"
    files = [(f"__editable__.{DIST}.pth", (HERE + "\n").encode())]
    _zip(os.path.join(wheel_directory, name), files + _dist_info(files))
    return name


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    base = f"{DIST}-{VERSION}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        paths = ["pyproject.toml", "README.md", "_build/backend.py"] + [p for p, _ in _package_files()]
        for p in paths:
            t.add(os.path.join(HERE, p), arcname=f"{base}/{p}")
        pkg = (METADATA + _readme()).encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg)
        t.addfile(ti, io.BytesIO(pkg))
    return name
