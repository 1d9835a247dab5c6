"""A measurement in a fresh Python process: nothing imported, cached or allocated by another one."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, *args: str, timeout: float = 600) -> tuple[dict[str, Any], float]:
    """Run ``code`` with ``python -c`` in the repository's root; it writes its findings as JSON to the file
    named by ``sys.argv[1]`` (``args`` follow). Returns them and the process's wall time as seen from here.

    Raises:
        RuntimeError: The process failed; the message ends with its stderr.
    """
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        result = Path(tmp) / "result.json"
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", code, str(result), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        wall = time.perf_counter() - start
        if done.returncode != 0 or not result.is_file():
            raise RuntimeError(f"the measuring process failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(result.read_text()), wall
