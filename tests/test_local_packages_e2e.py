"""The project's own package (``-e .`` in its requirements file) and a local one (``-e ./libs/
helper``), for real (docs/faults.md H53): ``lock`` records each by its source tree's sha256,
``build`` builds both from their sources in the extensions stage against the locked closure
(setuptools from their ``[build-system] requires``), and the image imports them; its installed
set is the lock's plus these two. The fixtures are test_lock_e2e's (the torch wheelhouse served
on 127.0.0.1, the base image in a loopback registry). Needs dockerd, docker-registry, the index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import tagged
from test_extensions_e2e import build, in_image
from test_lock_e2e import client, envbuild, pushed_base, torch_index, wheelhouse

__all__ = ["client", "pushed_base", "torch_index", "wheelhouse"]  # fixtures, used by name

pytestmark = [pytest.mark.docker, pytest.mark.network]

TAG = tagged("envbuild-test/local-packages:1")
PYPROJECT = """[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.3"
dependencies = {dependencies}

[tool.setuptools]
py-modules = ["{module}"]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pushed_base: str, torch_index: str) -> Path:
    directory = tmp_path_factory.mktemp("local-packages")
    (directory / "pyproject.toml").write_text(
        PYPROJECT.format(name="demo-app", dependencies='["six"]', module="demo_app"))
    (directory / "demo_app.py").write_text("import six, helper\nVALUE = helper.twice(21)\n")
    helper = directory / "libs" / "helper"
    helper.mkdir(parents=True)
    (helper / "pyproject.toml").write_text(
        PYPROJECT.format(name="helper", dependencies="[]", module="helper"))
    (helper / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    (directory / "requirements.txt").write_text("-e .\n-e ./libs/helper\n")
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{pushed_base}"\ntorch-index-url = "{torch_index}"\n'
        'requirements = ["requirements.txt"]\ncompile-toolchain = false\n')
    return directory


def test_the_projects_own_package_is_built_into_the_image(client: Any, project: Path) -> None:
    done = envbuild("lock", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((project / "envbuild.lock").read_text())["targets"]["default"]
    assert [(e["dir"], e["name"]) for e in target["extensions"]] == [(".", "demo-app"),
                                                                      ("libs/helper", "helper")]
    assert {"six", "setuptools"} <= set(target["packages"]) and "demo-app" not in target["packages"]
    built = build(project, TAG)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    value = in_image(TAG, "/opt/venv/bin/python", "-c", "import demo_app; print(demo_app.VALUE)")
    assert value.strip() == "42"
    assert in_image(TAG, "/opt/venv/bin/python", "/opt/envbuild/smoke.py", "--installed-only",
                    "--lock", "/opt/envbuild/envbuild.lock").startswith("installed set matches")
    assert envbuild("lock", "--check", cwd=project).returncode == 0
