"""The package as users get it: ``python -m build`` (an sdist that builds a wheel alone),
``pip wheel``, ``pip install -e``, the wheel's tag and contents, the ``kcache`` command, and
the message when cargo is missing. Each runs pip or build in a virtual environment of its own
over the system's packages (no index); cargo shares the repository's target directory."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "bindings" / "python"
WHEEL_TAG = re.compile(r"-py3-none-(manylinux_(\d+)_(\d+)_(\w+))\.whl$")
# An index refuses bigger files; the unstripped library alone was 32 MB.
MAX_LIBRARY_BYTES = 8 * 1000 * 1000


def env(**extra: str) -> dict[str, str]:
    target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    return {**os.environ, "CARGO_TARGET_DIR": target, "PIP_NO_INDEX": "1", **extra}


def run(*args: object, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env(**extra), timeout=1800
    )


def ok(*args: object, **extra: str) -> str:
    out = run(*args, **extra)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def venv(path: Path) -> Path:
    ok(sys.executable, "-m", "venv", "--system-site-packages", path)
    return path / "bin"


def glibc_needed(path: Path) -> tuple[int, int]:
    """The newest GLIBC_2.x an ELF file's version references ask for (readelf's view)."""
    dump = ok("readelf", "--version-info", "--wide", path)
    return max((int(a), int(b)) for a, b in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", dump))


def check_wheel(wheel: Path, tmp: Path) -> None:
    """A manylinux tag matching what the library and the command need, both stripped, the
    command executable and declared as a console script."""
    match = WHEEL_TAG.search(wheel.name)
    assert match is not None, wheel.name
    tag, major, minor, arch = match[1], int(match[2]), int(match[3]), match[4]
    from packaging.tags import sys_tags

    assert tag in {t.platform for t in sys_tags()}, f"{tag} is not installable here"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp)
        mode = archive.getinfo("kcache/bin/kcache").external_attr >> 16
        entry_points = archive.read("kcache-0.1.0.dist-info/entry_points.txt").decode()
    assert mode & stat.S_IXUSR
    assert re.search(r"^kcache = kcache._command:main$", entry_points, re.M)
    library, command = tmp / "kcache" / "libkcache.so", tmp / "kcache" / "bin" / "kcache"
    assert arch == os.uname().machine
    assert max(glibc_needed(library), glibc_needed(command)) == (major, minor)
    for path in (library, command):
        sections = ok("readelf", "--section-headers", "--wide", path)
        assert ".debug_info" not in sections and ".symtab" not in sections, path
    assert library.stat().st_size < MAX_LIBRARY_BYTES


def test_build_makes_an_sdist_that_builds_a_manylinux_wheel(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path / "venv")
    dist = tmp_path / "dist"
    # build makes the sdist, then the wheel from the unpacked sdist alone.
    ok(bin_dir / "python", "-m", "build", "--no-isolation", "--outdir", dist, PACKAGE)
    (sdist,) = dist.glob("kcache-0.1.0.tar.gz")
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    for name in ("Cargo.toml", "Cargo.lock", "src/lib.rs", "cli/src/main.rs", "README.md"):
        assert f"kcache-0.1.0/rust/{name}" in names
    (wheel,) = dist.glob("*.whl")
    check_wheel(wheel, tmp_path / "unpacked")
    ok(bin_dir / "pip", "install", "--no-deps", wheel)
    assert ok(bin_dir / "kcache", "--version").startswith("kcache")
    out = ok(bin_dir / "python", "-c", "import kcache; print(kcache.__file__)")
    assert out.startswith(str(tmp_path / "venv"))


def test_pip_wheel_makes_the_same_kind_of_wheel(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path / "venv")
    ok(bin_dir / "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", tmp_path, PACKAGE)
    (wheel,) = tmp_path.glob("*.whl")
    check_wheel(wheel, tmp_path / "unpacked")


def test_the_installed_package_has_its_command() -> None:
    # The package under test was installed with `pip install` (run-tests.sh): its command
    # sits next to the interpreter and lists a cache directory.
    command = Path(sys.executable).parent / "kcache"
    out = subprocess.run([command, "--help"], capture_output=True, text=True, check=True)
    assert "Usage: kcache" in out.stdout


def test_an_editable_install_imports_its_library(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path / "venv")
    ok(bin_dir / "pip", "install", "--no-build-isolation", "--no-deps", "-e", PACKAGE)
    script = "import kcache, kcache._lib as l; print(kcache.library_version(), l.lib._name)"
    version, library = ok(bin_dir / "python", "-c", script).split()
    assert library == str(PACKAGE / "src" / "kcache" / "libkcache.so")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert ok(bin_dir / "kcache", "--version").startswith("kcache")


def test_without_cargo_the_error_says_what_to_install(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path / "venv")
    # Only the environment's own programs: no cargo anywhere on PATH.
    out = run(
        bin_dir / "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", tmp_path, PACKAGE,
        PATH=str(bin_dir), CARGO="",
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "Install a Rust toolchain" in text, text[-3000:]
    assert "Errno 2" not in text
    assert not list(tmp_path.glob("*.whl"))


@pytest.fixture(autouse=True)
def _no_pip_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cached wheel would let pip skip the build under test.
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
