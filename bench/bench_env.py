"""The bench-only Python environment (scripts/bench-env.sh: PyTorch 2.x and transformers v5 from
PyPI, which `make test` never needs), for the comparison scripts of bench/.

    from bench_env import have_transformers_v5, reexec_in_bench_env
    reexec_in_bench_env("hf_v5_check", have_transformers_v5)   # returns here only when it holds
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reexec_in_bench_env(name, ready):
    """Returns when ready() says the running Python has the peers; otherwise runs the calling
    script again, with the same arguments, under the bench environment's Python (creating the
    environment first), and never returns. Exits with a message naming `name` when even that
    Python lacks them."""
    if ready():
        return
    if os.environ.get("GROUPLIN_BENCH_ENV"):
        sys.exit(f"{name}: the bench environment lacks what it needs (see scripts/bench-env.sh)")
    python = subprocess.check_output(["bash", os.path.join(ROOT, "scripts", "bench-env.sh")],
                                     text=True).strip().splitlines()[-1]
    os.execve(python, [python, os.path.abspath(sys.argv[0])] + sys.argv[1:],
              dict(os.environ, GROUPLIN_BENCH_ENV="1"))


def have_transformers_v5():
    """Whether the running Python has PyTorch, safetensors and transformers v5 (the peers of the
    Hugging Face checks)."""
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import transformers

        return int(transformers.__version__.split(".")[0]) >= 5
    except ImportError:
        return False
