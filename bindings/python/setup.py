"""Builds libkcache with cargo and ships it inside the package.

The wheel holds the library next to the Python modules, so an installed package needs no
system-wide kcache; GPU runtimes are not bundled (kcache loads them at run time). The Rust
sources are found two directories up, so install from a checkout of the repository:
``pip install bindings/python``. ``CARGO_TARGET_DIR`` is honoured.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parents[2]


class BuildWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        if not (ROOT / "Cargo.toml").is_file():
            raise SystemExit(f"kcache's Cargo.toml not found at {ROOT}: install from the repository")
        cargo = os.environ.get("CARGO", "cargo")
        subprocess.run(
            [cargo, "build", "--release", "--lib", "-p", "kcache", "--manifest-path",
             str(ROOT / "Cargo.toml")],
            check=True,
        )
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        if not target.is_absolute():
            target = ROOT / target
        dest = Path(self.build_lib) / "kcache"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / "release" / "libkcache.so", dest / "libkcache.so")


class BinaryDistribution(Distribution):
    # The wheel holds a native library: tag it for this platform, not "any".
    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    # ctypes needs no CPython ABI: one wheel per platform serves every Python 3.
    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
