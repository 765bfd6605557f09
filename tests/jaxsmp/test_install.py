"""What pyproject.toml declares: GPU extras that name the CUDA plugin of the installed
jax's version, and the supported jax/flax/optax range, stated once and in step with the
README."""
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
JAX = metadata.version("jax")


def plugins(extra: str) -> list[Requirement]:
    """What installing ``jaxsmp[extra]`` asks of the installed jax: its extra's plugins."""
    wanted = [Requirement(r) for r in EXTRAS[extra]]
    assert [(r.name, r.specifier) for r in wanted] == [("jax", Requirement("jax").specifier)], \
        f"{extra} must be jax's own extra, the jax range being the dependencies' alone"
    found = [Requirement(r) for r in metadata.requires("jax")]
    return [r for r in found if r.name.startswith("jax-cuda") and r.marker is not None
            and r.marker.evaluate({"extra": next(iter(wanted[0].extras))})]


@pytest.mark.parametrize("extra, plugin", [("cuda12", "jax-cuda12-plugin"),
                                           ("cuda13", "jax-cuda13-plugin")])
def test_a_cuda_extra_installs_the_plugin_of_the_installed_jax(extra, plugin):
    found = plugins(extra)
    assert [r.name for r in found] == [plugin]
    assert found[0].specifier.contains(JAX)


def test_cuda_is_the_cuda13_extra():
    assert EXTRAS["cuda"] == ["jaxsmp[cuda13]"]


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_the_test_extra_pins_the_cuda12_plugin_of_jaxlibs_version_on_every_python(python):
    env = {"python_version": python, "extra": "test"}
    pins = {}
    for r in map(Requirement, EXTRAS["test"]):
        if r.name in ("jax", "jaxlib", "jax-cuda12-plugin") and (
                r.marker is None or r.marker.evaluate(env)):
            assert r.name not in pins, f"two pins of {r.name} on Python {python}"
            pins[r.name] = str(r.specifier)
    assert "jax-cuda12-plugin" in pins, f"no CUDA plugin on Python {python}"
    if python >= "3.12":  # several jax releases install there: all three pinned together
        assert pins["jax"] == pins["jaxlib"] == pins["jax-cuda12-plugin"]
    else:  # JAX 0.10.2 is the newest release for Python 3.11
        assert pins == {"jax-cuda12-plugin": "==0.10.2"}
    if python == f"{sys.version_info.major}.{sys.version_info.minor}":
        assert pins["jax-cuda12-plugin"] == f"=={JAX}"


def test_gpu_compile_tests_fail_under_ci_instead_of_skipping(monkeypatch):
    from conftest import require_gpu_compiler

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", missing)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs jax-cuda12-plugin==.*found none"):
        require_gpu_compiler()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="GPU-compile test not run under CI"):
        require_gpu_compiler()


def supported() -> dict[str, SpecifierSet]:
    """The dependencies' bounds of jax, flax and optax."""
    found = {Requirement(r).name: Requirement(r).specifier for r in PROJECT["dependencies"]}
    return {name: found[name] for name in ("jax", "flax", "optax")}


def test_the_readme_states_the_supported_range_of_pyproject():
    readme = (ROOT / "README.md").read_text()
    stated = {n: SpecifierSet(s) for n, s in re.findall(r"`(jax|flax|optax)(>=[^`]+)`", readme)}
    assert stated == supported()
    assert stated["jax"].contains(JAX)
