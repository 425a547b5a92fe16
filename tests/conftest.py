import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_amplint():
    """Run the installed CLI as a user does: a separate process, real exit code."""
    import subprocess

    def run(*args, cwd=None, env=None, input=None):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "amplint", *map(str, args)], cwd=cwd,
                              env=full_env, capture_output=True, text=True, input=input)
    return run
