"""What the peer tests share: the grouplin command under test and a scratch directory."""
import os
import subprocess
import tempfile
import unittest

CLI = os.environ.get("GROUPLIN_CLI") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "grouplin")
SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def grouplin(*args):
    """Runs `grouplin ARGS`; fails the test with its output unless it exits 0."""
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"grouplin {' '.join(map(str, args))}: exit {r.returncode}\n"
                             f"{r.stdout}{r.stderr}")
    return r


class ScratchTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="grouplin-peers-")
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)
