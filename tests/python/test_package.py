"""The installed package itself: its files, its command, its version, its docstrings."""

import inspect as pyinspect
import os
import subprocess

import grouplin
import grouplin.torch


def package_dir():
    return os.path.dirname(grouplin.__file__)


def test_stubs_and_py_typed_are_shipped_and_cover_the_extension():
    files = os.listdir(package_dir())
    assert "py.typed" in files and "_core.pyi" in files
    stub = open(os.path.join(package_dir(), "_core.pyi")).read()
    for name in dir(grouplin._core):
        if not name.startswith("__"):
            assert f"def {name}(" in stub or f"class {name}" in stub, name


def test_the_command_is_installed_with_the_same_version(cli):
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == f"grouplin {grouplin.__version__}"


def test_bench_says_when_its_openblas_baselines_are_absent(cli):
    out = subprocess.run([cli, "bench", "--quick", "--shapes", "mixtral", "--ops", "forward",
                          "--dtype", "f32", "--rows", "64", "--routing", "uniform"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    if os.environ.get("GROUPLIN_PACKAGE_WITHOUT_OPENBLAS") == "1":  # as tests/python/run.sh builds
        assert "dense and loop baselines absent" in out.stdout
        assert "OpenBLAS 0." not in out.stdout
    else:
        assert "OpenBLAS" in out.stdout.splitlines()[0]


def test_everything_public_has_a_docstring():
    for module in (grouplin, grouplin.torch):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) or pyinspect.isclass(obj):
                assert obj.__doc__, f"{module.__name__}.{name}"
            if pyinspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and callable(member):
                        assert member.__doc__, f"{module.__name__}.{name}.{attr}"
    for name in dir(grouplin._core):
        if not name.startswith("__"):
            assert getattr(grouplin._core, name).__doc__, name
