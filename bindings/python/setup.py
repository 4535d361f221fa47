"""Builds libkcache and the ``kcache`` command with cargo and ships both inside the package.

The wheel holds the library and the command next to the Python modules, so an installed
package needs no system-wide kcache; GPU runtimes are not bundled (kcache loads them at run
time). The Rust sources come from the repository this directory sits in (two levels up), or,
in a source distribution, from its ``rust/`` directory, which ``sdist`` fills with the crate
and its workspace. ``CARGO`` names the cargo to run and ``CARGO_TARGET_DIR`` is honoured.

The wheel is tagged ``manylinux_2_<N>_<arch>``, where ``2.<N>`` is the newest glibc symbol
version the library and the command need (read from their ELF version references), as
auditwheel would tag it; the library and the command are stripped of debug information.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution
from setuptools.errors import ExecError
from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
# Where an sdist keeps the crate; a checkout has it two levels up.
SDIST_CRATE = "rust"
# What cargo needs to build the library and the command: the workspace's manifests and
# sources (the test kit and the OpenCL layer are workspace members, and the root manifest
# names its benchmarks and the tests that need a cargo feature),
# the README the crate documentation includes, and the licences.
CRATE_FILES = [
    "Cargo.toml",
    "Cargo.lock",
    "build.rs",
    "README.md",
    "LICENSE",
    "LICENSE-MIT",
    "LICENSE-APACHE",
    "src",
    "benches",
    "tests",
    "cli/Cargo.toml",
    "cli/src",
    "testkit/Cargo.toml",
    "testkit/build.rs",
    "testkit/src",
    "layers/opencl/Cargo.toml",
    "layers/opencl/build.rs",
    "layers/opencl/src",
]
# The libraries a manylinux wheel may need from the system (PEP 600: glibc and its parts, and
# libgcc_s, which every Linux with a C compiler has).
MANYLINUX_LIBRARIES = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
LIBRARY = "libkcache.so"
COMMAND = "bin/kcache"


def crate_root() -> Path:
    for root in (HERE / SDIST_CRATE, HERE.parents[1]):
        if (root / "Cargo.toml").is_file():
            return root
    raise ExecError(
        f"kcache's Rust sources were not found (neither {HERE / SDIST_CRATE} nor "
        f"{HERE.parents[1]} holds a Cargo.toml): build from the repository or from an sdist"
    )


def find_cargo() -> str:
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo is None or shutil.which(cargo) is None:
        raise ExecError(
            "kcache's library is built from its Rust sources with cargo, which was not found "
            f"({'CARGO=' + cargo if cargo else 'not on PATH'}). Install a Rust toolchain "
            "(Rust 1.85 or newer: https://rustup.rs, or the distribution's cargo package) and "
            "a C linker (cc), or set CARGO to cargo's path; then install again."
        )
    return cargo


def install_built(source: Path, dest: Path, strip: bool) -> None:
    """Copies a built file into the package, without its debug information when ``strip``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    stripper = shutil.which("strip") if strip else None
    if stripper is None:
        if strip:
            print(f"warning: no strip command: {dest.name} keeps its debug information")
        shutil.copy2(source, dest)
        return
    dest.unlink(missing_ok=True)
    subprocess.run([stripper, "--strip-unneeded", "-o", str(dest), str(source)], check=True)


def elf_needs(path: Path) -> tuple[set[str], tuple[int, int]]:
    """The libraries ``path`` needs (DT_NEEDED) and the newest glibc version it asks for."""
    dump = subprocess.run(
        ["objdump", "-p", str(path)], check=True, capture_output=True, text=True
    ).stdout
    needed = set(re.findall(r"^\s*NEEDED\s+(\S+)", dump, re.M))
    versions = [(int(a), int(b)) for a, b in re.findall(r"\bGLIBC_(\d+)\.(\d+)", dump)]
    return needed, max(versions, default=(2, 17))


class BuildWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        root = crate_root()
        subprocess.run(
            [find_cargo(), "build", "--release", "-p", "kcache", "-p", "kcache-cli",
             "--manifest-path", str(root / "Cargo.toml")],
            check=True,
        )
        target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
        if not target.is_absolute():
            target = root / target
        built = target / "release"
        # An editable install imports the package from its sources: the files go there, and
        # keep their debug information for the developer.
        if self.editable_mode:
            dest, strip = HERE / self.get_package_dir("kcache"), False
        else:
            dest, strip = Path(self.build_lib) / "kcache", True
        install_built(built / LIBRARY, dest / LIBRARY, strip)
        install_built(built / "kcache", dest / COMMAND, strip)


class SdistWithCrate(sdist):
    """An sdist that carries the crate, so that a wheel builds from it alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = crate_root()
        for name in CRATE_FILES:
            source, dest = root / name, Path(base_dir) / SDIST_CRATE / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, ignore=shutil.ignore_patterns("target"))
            else:
                shutil.copy2(source, dest)


class BinaryDistribution(Distribution):
    # The wheel holds a native library: tag it for this platform, not "any".
    def has_ext_modules(self) -> bool:
        return True


class ManylinuxWheel(bdist_wheel):
    # ctypes needs no CPython ABI: one wheel per platform serves every Python 3.
    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", self.platform_tag()

    def platform_tag(self) -> str:
        package = Path(self.get_finalized_command("build_py").build_lib) / "kcache"
        arch = platform.machine()
        fallback = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        needed: set[str] = set()
        newest = (2, 17)
        for path in (package / LIBRARY, package / COMMAND):
            libraries, version = elf_needs(path)
            needed |= libraries
            newest = max(newest, version)
        outside = needed - MANYLINUX_LIBRARIES
        if outside:
            print(f"warning: {sorted(outside)} are not manylinux libraries: tagged {fallback}")
            return fallback
        return f"manylinux_{newest[0]}_{newest[1]}_{arch}"


setup(
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": ManylinuxWheel, "sdist": SdistWithCrate},
    distclass=BinaryDistribution,
)
