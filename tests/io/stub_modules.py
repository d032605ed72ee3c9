"""Stand-in modules under real import paths, for the scripts that pickle objects as other
projects' code does without that project installed (te_fp8_peer.py, real_writers/)."""
import sys
import types


def module(name):
    """The module `name` (and its parents), created empty where it does not exist yet."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        full = ".".join(parts[:i])
        if full not in sys.modules:
            sys.modules[full] = types.ModuleType(full)
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[full])
    return sys.modules[name]
