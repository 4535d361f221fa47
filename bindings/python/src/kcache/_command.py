"""The ``kcache`` command installed with the package: runs the command built with the library."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn


def main() -> NoReturn:
    command = Path(__file__).with_name("bin") / "kcache"
    # Replaces this interpreter: the command's exit status and signals are the caller's.
    os.execv(command, ["kcache", *sys.argv[1:]])
