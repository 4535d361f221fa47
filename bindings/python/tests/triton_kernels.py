# mypy: ignore-errors
# (Triton is untyped, and the type check runs where it is not installed.)
"""Real Triton kernels compiled with no GPU (``triton.compile`` of an ``ASTSource`` for an sm_90
target: the whole pipeline to a cubin, with the ptxas Triton's wheel ships), for the tests of
``kcache.triton`` and its benchmark.

Run as a script (by a Python that has Triton) it compiles the kernels and prints one JSON line:
the kernels compiled (Triton's compilation listener, ``cache_hit`` False), those found in the
cache, and the digest of each cubin. ``--start-at T`` waits until the wall clock reaches ``T``
so that processes started one after another begin together; ``--set`` picks the kernels.
``KCACHE_TEST_HOLD=1`` makes a process that compiled a kernel stop before storing it (the
test kills it there). ``--keep S`` keeps the last compile error alive after the report (in
``sys.last_value``, as ``python -i`` does) until a line comes on standard input or
S seconds pass, then prints the report again and exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import sys
import time
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


@triton.jit
def matmul_kernel(  # type: ignore[no-untyped-def]
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak)
        b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


@triton.jit
def bad_kernel(x_ptr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    # Fails to compile: tl.arange needs a power-of-two range.
    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)


# An autotuned kernel: with no GPU the autotuner cannot time its configs, so each config is
# compiled as the autotuner would compile it.
matmul = triton.autotune(
    configs=[
        triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=3),
        triton.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=4, num_stages=4),
        triton.Config({"BM": 64, "BN": 128, "BK": 64}, num_warps=8, num_stages=3),
    ],
    key=["M", "N", "K"],
)(matmul_kernel)

_ADD = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
_SOFTMAX = {"out_ptr": "*fp32", "in_ptr": "*fp32", "stride": "i32", "n_cols": "i32",
            "BLOCK": "constexpr"}
_MATMUL = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32",
           "K": "i32", "sam": "i32", "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32",
           "scn": "i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}


def kernels(which: str = "all") -> list[tuple[str, ASTSource, dict[str, Any]]]:
    """(label, source, options) of each kernel of set ``which``: ``all`` (6 kernels),
    ``small`` (the add kernel alone), ``add`` (two add kernels) or ``bad`` (a kernel that
    fails to compile, then the add kernel)."""
    out: list[tuple[str, ASTSource, dict[str, Any]]] = []
    if which == "bad":
        out.append(("bad", ASTSource(bad_kernel, {"x_ptr": "*fp32", "BLOCK": "constexpr"},
                                     {"BLOCK": 100}), {}))
    for block in (128, 1024):
        out.append((f"add{block}", ASTSource(add_kernel, _ADD, {"BLOCK": block}), {"num_warps": 4}))
    if which in ("small", "bad"):
        return out[: len(out) - 1]
    if which == "add":
        return out
    out.append(("softmax", ASTSource(softmax_kernel, _SOFTMAX, {"BLOCK": 1024}), {"num_warps": 8}))
    for i, config in enumerate(matmul.configs):
        src = ASTSource(matmul_kernel, _MATMUL, dict(config.kwargs))
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        out.append((f"matmul{i}", src, options))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", default="all")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tries", type=int, default=1, help="compile each kernel so often")
    parser.add_argument("--keep", type=float, default=0.0, help="keep the error so long")
    args = parser.parse_args()

    import threading

    compiled: list[str] = []
    found: list[str] = []
    failed: list[str] = []
    local = threading.local()

    def listener(**kw: Any) -> None:
        (found if kw["cache_hit"] else compiled).append(local.label)

    from triton import knobs

    knobs.compilation.listener = listener
    if os.environ.get("KCACHE_TEST_HOLD"):
        import kcache.triton

        store = kcache.triton.CacheManager.put_group

        def hold(self: Any, filename: str, group: dict[str, str]) -> str:
            print(json.dumps({"holding": filename}), flush=True)
            time.sleep(3600)
            return store(self, filename, group)

        kcache.triton.CacheManager.put_group = hold  # type: ignore[method-assign]

    todo = kernels(args.set)
    while time.time() < args.start_at:
        time.sleep(0.001)
    start = time.monotonic()
    cubins = {}
    wrong: list[str] = []

    def compile_all() -> None:
        for name, src, options in todo:
            for _ in range(args.tries):
                local.label = name
                try:
                    kernel = triton.compile(src, target=TARGET, options=options)
                except Exception as exc:  # noqa: BLE001 - the bad kernel
                    failed.append(name)
                    if args.keep:
                        # Its traceback holds compile()'s frame, and so its cache manager.
                        sys.last_value = exc
                    continue
                cubin = kernel.asm["cubin"]
                if not cubin.startswith(b"\x7fELF") or kernel.metadata.name != src.fn.__name__:
                    wrong.append(name)
                cubins[name] = hashlib.sha256(cubin).hexdigest()

    threads = [threading.Thread(target=compile_all) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if wrong:
        sys.exit(f"not the cubins of their kernels: {wrong}")
    seconds = time.monotonic() - start

    def print_report() -> None:
        report: dict[str, Any] = {
            "compiled": compiled, "found": found, "failed": failed, "cubins": cubins,
            "seconds": seconds, "triton": triton.__version__,
        }
        if os.environ.get("TRITON_CACHE_MANAGER", "").startswith("kcache.") or os.environ.get(
            "TRITON_REMOTE_CACHE_BACKEND", ""
        ).startswith("kcache."):
            import dataclasses

            import kcache.triton

            report["stats"] = dataclasses.asdict(kcache.triton.stats())
            disk = kcache.triton.disk()
            if disk is not None:
                disk.flush()
                report["disk"] = dataclasses.asdict(disk.stats())
        print(json.dumps(report), flush=True)

    print_report()
    if args.keep:
        select.select([sys.stdin], [], [], args.keep)
        print_report()


if __name__ == "__main__":
    main()
