"""PyOpenCL programs through kcache, on whatever OpenCL platform is installed (PoCL in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_threads

import kcache
import kcache.opencl

cl = pytest.importorskip("pyopencl")
np = pytest.importorskip("numpy")

SOURCE = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }"


@pytest.fixture(scope="module")
def context() -> object:
    if not kcache.opencl.available():
        pytest.skip("no OpenCL runtime")
    platforms = cl.get_platforms()
    if not platforms:
        pytest.skip("no OpenCL platform")
    return cl.Context(devices=[platforms[0].get_devices()[0]])


def run_kernel(context: object, program: object, kernel: str, data: object) -> list[float]:
    """Runs `kernel` of `program` over `data` (float32, read and written), and reads it back."""
    queue = cl.CommandQueue(context)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
    getattr(program, kernel)(queue, data.shape, None, buf)  # type: ignore[attr-defined]
    cl.enqueue_copy(queue, data, buf)
    queue.finish()
    return [float(x) for x in data]  # type: ignore[attr-defined]


def run_twice(context: object, program: object) -> list[float]:
    return run_kernel(context, program, "twice", np.arange(4, dtype=np.float32))


def test_a_program_is_compiled_once_and_runs(context: object, tmp_path: Path) -> None:
    with kcache.opencl.ProgramCache(disk_dir=tmp_path / "kc") as cache:
        program = cache.get_program(context, None, SOURCE, ["-cl-mad-enable"])
        assert isinstance(program, cl.Program)
        assert run_twice(context, program) == [0.0, 2.0, 4.0, 6.0]
        again = cache.get_program(context, None, SOURCE, "-cl-mad-enable")
        assert again.int_ptr == program.int_ptr
        stats = cache.stats()
        assert (stats.source_builds, stats.memory.hits, stats.memory.misses) == (1, 1, 1)
        # Evicting gives up the cache's reference only: the caller's program still works.
        assert cache.evict_context(context) == 1
        assert run_twice(context, program) == [0.0, 2.0, 4.0, 6.0]


def run_scaled(context: object, program: object) -> float:
    """What the kernel ``scale`` multiplied 1.0 by."""
    return run_kernel(context, program, "scale", np.ones(1, dtype=np.float32))[0]


def test_a_changed_header_is_built_again(context: object, tmp_path: Path) -> None:
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "factor.h").write_text("#define FACTOR 3.0f\n")
    kernel = "__kernel void scale(__global float *x) { x[get_global_id(0)] *= FACTOR; }\n"
    keyed = '#include "factor.h"\n' + kernel
    computed = '#define HEADER "factor.h"\n#include HEADER\n' + kernel
    options = ["-I", str(headers)]
    with kcache.opencl.ProgramCache(disk_dir=tmp_path / "kc") as cache:
        assert run_scaled(context, cache.get_program(context, None, keyed, options)) == 3.0
        assert run_scaled(context, cache.get_program(context, None, keyed, options)) == 3.0
        (headers / "factor.h").write_text("#define FACTOR 5.0f\n")
        assert run_scaled(context, cache.get_program(context, None, keyed, options)) == 5.0
        # kcache cannot key a computed include: compiled, cached nowhere, counted.
        assert run_scaled(context, cache.get_program(context, None, computed, options)) == 5.0
        stats = cache.stats()
        assert (stats.source_builds, stats.memory.hits, stats.passed_through) == (3, 1, 1)


def test_threads_share_one_compile(context: object, tmp_path: Path) -> None:
    source = SOURCE + "\n// threads"
    with kcache.opencl.ProgramCache(use_disk=False) as cache:
        programs = run_threads(4, lambda: cache.get_program(context, None, source).int_ptr)
        assert len(set(programs)) == 1
        stats = cache.stats()
        assert (stats.source_builds, stats.memory.misses) == (1, 1)
        assert stats.memory.hits + stats.memory.waits == 3


def test_a_compile_error_carries_the_log(context: object) -> None:
    with kcache.opencl.ProgramCache(use_disk=False) as cache:
        with pytest.raises(kcache.BuildFailedError) as info:
            cache.get_program(context, None, "__kernel void broken( { }")
        assert info.value.code == cl.status_code.BUILD_PROGRAM_FAILURE
        assert "error" in str(info.value).lower()
        assert str(info.value).startswith("KC_ERR_BUILD_FAILED: ")


def test_a_compile_error_is_a_pyopencl_error(context: object) -> None:
    # Code written for Program.build catches it unchanged.
    with kcache.opencl.ProgramCache(use_disk=False) as cache:
        with pytest.raises(cl.RuntimeError) as info:
            cache.get_program(context, None, "__kernel void broken( { }")
    assert isinstance(info.value, cl.Error)
    assert isinstance(info.value, kcache.opencl.ProgramBuildError)
    assert info.value.code == cl.status_code.BUILD_PROGRAM_FAILURE


def test_without_an_opencl_runtime_the_cache_is_unavailable() -> None:
    script = textwrap.dedent(
        """
        import kcache, kcache.opencl
        assert not kcache.opencl.available()
        try:
            kcache.opencl.ProgramCache(use_disk=False)
        except kcache.UnavailableError as exc:
            print(exc.status_name)
        """
    )
    env = dict(os.environ, KCACHE_OPENCL_LIBRARY="/nonexistent/libOpenCL.so.1")
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env
    )
    assert out.stdout.strip() == "KC_ERR_UNAVAILABLE"


SECOND = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import pyopencl as cl
    import kcache.opencl

    context = cl.Context(devices=[cl.get_platforms()[0].get_devices()[0]])
    cache = kcache.opencl.ProgramCache(disk_dir=sys.argv[1])
    program = cache.get_program(context, None, sys.argv[2])
    queue = cl.CommandQueue(context)
    data = np.arange(4, dtype=np.float32)
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
    program.twice(queue, data.shape, None, buf)
    cl.enqueue_copy(queue, data, buf)
    stats = cache.stats()
    print(json.dumps({"data": data.tolist(), "source_builds": stats.source_builds,
                      "binary_loads": stats.binary_loads,
                      "memory": [stats.memory.builds, stats.memory.loads]}))
    """
)


def test_a_second_process_loads_the_binary(context: object, tmp_path: Path) -> None:
    source = SOURCE + "\n// second process"
    with kcache.opencl.ProgramCache(disk_dir=tmp_path / "kc") as cache:
        run_twice(context, cache.get_program(context, None, source))
        cache.flush()
        assert cache.stats().disk.puts == 1
    out = subprocess.run(
        [sys.executable, "-c", SECOND, str(tmp_path / "kc"), source],
        check=True, capture_output=True, text=True, env=dict(os.environ),
    )
    assert json.loads(out.stdout) == {
        "data": [0.0, 2.0, 4.0, 6.0], "source_builds": 0, "binary_loads": 1, "memory": [0, 1],
    }


def test_get_program_uses_the_default_cache(
    context: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kcache.opencl, "_default", None)
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "kc"))
    program = kcache.opencl.get_program(context, None, SOURCE + "\n// default")
    assert run_twice(context, program) == [0.0, 2.0, 4.0, 6.0]
    assert kcache.opencl.default_cache().stats().source_builds == 1
