"""What pyproject.toml declares: GPU extras that name the CUDA plugin of the installed
jax's version, and the supported jax/flax/optax range, stated once and in step with the
README."""
import re
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


def test_the_test_extra_pins_the_cuda12_plugin_of_the_installed_jax():
    pins = [Requirement(r) for r in EXTRAS["test"] if r.startswith("jax-cuda12-plugin")]
    assert len(pins) == 1
    if pins[0].marker.evaluate():
        assert str(pins[0].specifier) == f"=={JAX}"
def supported() -> dict[str, SpecifierSet]:
    """The dependencies' bounds of jax, flax and optax."""
    found = {Requirement(r).name: Requirement(r).specifier for r in PROJECT["dependencies"]}
    return {name: found[name] for name in ("jax", "flax", "optax")}


def test_the_readme_states_the_supported_range_of_pyproject():
    readme = (ROOT / "README.md").read_text()
    stated = {n: SpecifierSet(s) for n, s in re.findall(r"`(jax|flax|optax)(>=[^`]+)`", readme)}
    assert stated == supported()
    assert stated["jax"].contains(JAX)
