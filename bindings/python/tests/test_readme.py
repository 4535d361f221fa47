"""The README's Python quick start runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_quick_start_runs(tmp_path: Path) -> None:
    pytest.importorskip("pyopencl")
    text = README.read_text()
    block = re.search(r"## Python quick start.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    env = dict(os.environ, KCACHE_DIR=str(tmp_path / "kc"))
    out = subprocess.run(
        [sys.executable, "-c", block.group(1)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["compiled saxpy", "unloaded compiled saxpy"]
    assert len(list((tmp_path / "kc").rglob("*"))) > 0
