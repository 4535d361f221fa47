"""kcache's log through Python's ``logging`` and the process's metrics as Prometheus text."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kcache

LOGGED = textwrap.dedent(
    """
    import json, logging, sys
    import kcache

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("kcache").addHandler(handler)
    logging.getLogger("kcache").setLevel(logging.DEBUG)
    with kcache.Disk(sys.argv[1]) as disk:
        tiered = kcache.TieredCache(kcache.Cache(), disk, load=bytes.decode, serialize=str.encode)
        tiered.find_or_build("k", lambda k: "v").release()
    print(json.dumps([[r.name, r.levelname, r.getMessage()] for r in records]))
    """
)


def test_kcache_s_log_reaches_the_kcache_logger(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", LOGGED, str(tmp_path / "kc")],
        check=True, capture_output=True, text=True, env=dict(os.environ, KCACHE_LOG="debug"),
    )
    records = json.loads(out.stdout)
    # The first lookup of a fresh directory misses the disk: kcache says so at debug level.
    misses = [r for r in records if r[2].startswith("disk miss:")]
    assert len(misses) == 1 and misses[0][:2] == ["kcache", "DEBUG"], records
    assert "disk miss" not in out.stderr


def builds_ok(text: str) -> int:
    found = re.search(r'^kcache_builds_total\{backend="c",result="ok"\} (\d+)$', text, re.M)
    assert found is not None, text[:2000]
    return int(found[1])


def test_metrics_render_the_process_s_counters() -> None:
    # Metrics add up the caches alive now: a cache of an earlier test held in a reference
    # cycle would leave the sum when the collector happens to run, so it runs first.
    gc.collect()
    before = builds_ok(kcache.render_metrics())
    with kcache.Cache[int]() as cache:
        for key in ("metrics-a", "metrics-b", "metrics-a"):
            cache.find_or_build(key, lambda k: 1).release()
        text = kcache.render_metrics()
    assert builds_ok(text) == before + 2
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name for f in parser.text_string_to_metric_families(text)}
    assert {"kcache_builds", "kcache_caches"} <= families
