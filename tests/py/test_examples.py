"""The quick start of README.md (examples/quickstart.py) runs as a user runs it."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quickstart_trains_and_grows_the_table():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"loss ([0-9.]+); table rows (\d+)", out.stdout)
    assert m, out.stdout
    assert float(m.group(1)) < 0.6931  # below the untrained log(2)
    assert 0 < int(m.group(2)) < 4096
