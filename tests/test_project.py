"""The project file (envbuild/project/): discovery, every key, the dependency sources, and
every bad input with its exit code and FILE:LINE: KEY (docs/faults.md H7 to H17, H19)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbuild.errors import UsageError
from envbuild.project.config import load_project
from envbuild.project.model import Project, Target
from envbuild.project.requirements import logical_lines
from envbuild.project.toml import dotted, line_of


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def load(root: Path, files: dict[str, str], path: str | None = None) -> Project:
    write(root, files)
    return load_project(Path(path) if path else None, root)


def refused(root: Path, files: dict[str, str], path: str | None = None) -> str:
    """The one-line message of the UsageError (exit 2) loading ``files`` raises."""
    with pytest.raises(UsageError) as caught:
        load(root, files, path)
    assert caught.value.exit_code == 2
    line = caught.value.one_line()
    assert "\n" not in line
    return line


EVERY_KEY = """\
torch = ">=2.3,<2.6"
python = "3.11"
cuda = "12.4"
cudnn = "9"
ubuntu = "22.04"
variant = "cu124"
flavor = "devel"
companions = false
pyproject = "sub/pyproject.toml"
extras = ["gpu"]
groups = ["dev"]
requirements = ["requirements.txt"]
dependencies = ["rich>=13", "torchaudio"]
apt-packages = ["git", "libgl1"]
user = "worker"
base-image = "registry.local:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04"
index-url = "https://mirror.local/simple"
torch-index-url = "https://mirror.local/whl/cu124"
find-links = ["wheels", "https://mirror.local/wheels/"]

[env]
HF_HOME = "/cache/hf"
A_B = "x=y"

[registry-mirrors]
"docker.io" = "http://127.0.0.1:5000"

[[targets]]
name = "h100"
driver = "550.54.15"
gpus = ["H100 SXM"]
datacenter = true

[[targets]]
name = "ws"
driver = "560"
archs = ["sm_89"]
"""

SUB_PYPROJECT = """\
[project]
name = "demo"
dependencies = ["requests>=2.31", "torch<2.6"]

[project.optional-dependencies]
gpu = ["numpy; python_version >= '3.10'"]
"""


def test_every_key_of_envbuild_toml(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    project = load(tmp_path, {
        "envbuild.toml": EVERY_KEY,
        "sub/pyproject.toml": SUB_PYPROJECT + "\n[dependency-groups]\ndev = ['pytest']\n",
        "requirements.txt": "pillow\n"})
    assert project.path == tmp_path / "envbuild.toml" and project.root == tmp_path
    assert project.targets == (
        Target(name="h100", driver="550.54.15", gpus=("H100 SXM",), datacenter=True),
        Target(name="ws", driver="560", archs=("sm_89",)))
    assert (project.torch, project.python, project.cuda, project.cudnn, project.ubuntu,
            project.variant, project.flavor, project.companions) == (
        ">=2.3,<2.6", "3.11", "12.4", "9", "22.04", "cu124", "devel", False)
    assert project.dependencies == ("numpy; python_version >= '3.10'", "pillow", "pytest",
                                    "requests>=2.31", "rich>=13")
    assert project.torch_constraints == ("torch<2.6", "torchaudio")
    assert project.apt_packages == ("git", "libgl1")
    assert project.env == (("HF_HOME", "/cache/hf"), ("A_B", "x=y"))
    assert project.user == "worker"
    assert project.base_image == "registry.local:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    assert project.index_url == "https://mirror.local/simple"
    assert project.torch_index_url == "https://mirror.local/whl/cu124"
    assert project.find_links == (str(tmp_path / "wheels"), "https://mirror.local/wheels/")
    assert dict(project.registry_mirrors) == {"docker.io": "http://127.0.0.1:5000"}
    assert project.sources == ("envbuild.toml", "requirements.txt", "sub/pyproject.toml")
    assert re.fullmatch(r"[0-9a-f]{64}", project.inputs_digest)
    assert project.target("ws").archs == ("sm_89",)


def test_defaults_and_the_implicit_default_target(tmp_path: Path) -> None:
    project = load(tmp_path, {"envbuild.toml": 'driver = "550"\ngpus = ["RTX 4090"]\ndatacenter = false\n'})
    assert project.targets == (Target(name="default", driver="550", gpus=("RTX 4090",)),)
    assert (project.flavor, project.companions, project.user) == ("runtime", True, "envbuild")
    assert project.dependencies == project.torch_constraints == project.find_links == ()
    assert project.base_image is None and project.index_url is None and project.env == ()
    assert load(tmp_path / "empty", {"envbuild.toml": ""}).targets == (Target(name="default"),)


PYPROJECT = """\
[project]
name = "demo"
version = "1.0"
dependencies = [
    "requests>=2.31",
    "Torch>=2.4",
]

[project.optional-dependencies]
gpu = ["numpy"]
all = ["demo[gpu,viz]", "tqdm"]
viz = ["matplotlib; platform_system == 'Linux'"]

[dependency-groups]
test = ["pytest", {include-group = "lint"}]
lint = ["ruff", "requests>=2.31"]

[tool.envbuild]
extras = ["all"]
groups = ["test"]

[[tool.envbuild.targets]]
name = "a100"
driver = "550"
gpus = ["A100"]
"""


def test_pyproject_extras_groups_and_include_group(tmp_path: Path) -> None:
    project = load(tmp_path, {"pyproject.toml": PYPROJECT})
    assert project.path.name == "pyproject.toml"
    assert project.targets == (Target(name="a100", driver="550", gpus=("A100",)),)
    # the self-reference demo[gpu,viz] pulls both extras in; the duplicate requests>=2.31 is one line
    assert project.dependencies == ("matplotlib; platform_system == 'Linux'", "numpy", "pytest",
                                    "requests>=2.31", "ruff", "tqdm")
    assert project.torch_constraints == ("Torch>=2.4",)
    assert project.sources == ("pyproject.toml",)


def test_same_name_from_two_sources_is_kept_for_uv_to_merge(tmp_path: Path) -> None:
    project = load(tmp_path, {"envbuild.toml": 'requirements = ["r.txt"]\ndependencies = ["idna<4"]\n',
                              "r.txt": "idna>=3\nidna<4\n"})
    assert project.dependencies == ("idna<4", "idna>=3")


def test_discovery_order(tmp_path: Path) -> None:
    """An explicit path first, then ./envbuild.toml, then ./pyproject.toml with [tool.envbuild]."""
    write(tmp_path, {"pyproject.toml": '[tool.envbuild]\ntorch = "2.4"\n',
                     "envbuild.toml": 'torch = "2.5"\n', "other.toml": 'torch = "2.6"\n'})
    assert load_project(None, tmp_path).torch == "2.5"
    assert load_project(Path("other.toml"), tmp_path).torch == "2.6"
    assert load_project(tmp_path / "pyproject.toml", Path("/")).torch == "2.4"
    (tmp_path / "envbuild.toml").unlink()
    assert load_project(None, tmp_path).torch == "2.4"


def test_no_project_file_says_run_init(tmp_path: Path) -> None:
    """docs/faults.md H16"""
    message = refused(tmp_path, {})
    assert "no project file" in message and "envbuild init" in message
    message = refused(tmp_path, {"pyproject.toml": '[project]\nname = "x"\n'})
    assert "no [tool.envbuild]" in message and "envbuild init" in message
    message = refused(tmp_path, {}, path="missing.toml")
    assert "missing.toml does not exist" in message


def test_toml_syntax_error_keeps_line_and_column(tmp_path: Path) -> None:
    """docs/faults.md H7"""
    message = refused(tmp_path, {"pyproject.toml": '[project]\nname = "x"\n\n'
                                                   '[tool.envbuild]\ntorch = 2.4.1\n'})
    assert "pyproject.toml:5: TOML syntax error:" in message
    assert "line 5, column" in message
    message = refused(tmp_path / "b", {"envbuild.toml": 'torch = "2.4\n'})
    assert "envbuild.toml:1: TOML syntax error" in message


def test_unknown_key_with_did_you_mean(tmp_path: Path) -> None:
    """docs/faults.md H8"""
    message = refused(tmp_path, {"pyproject.toml": '[project]\nname = "x"\n[tool.envbuild]\n'
                                                   'torch = "2.4"\napt_packages = ["git"]\n'})
    assert "pyproject.toml:5: tool.envbuild.apt_packages: unknown key" in message
    assert "did you mean 'apt-packages'?" in message
    message = refused(tmp_path / "b", {"envbuild.toml": '[[targets]]\nname = "a"\ngpu = ["A100"]\n'})
    assert "envbuild.toml:3: targets[0].gpu: unknown key" in message and "'gpus'" in message
    # pyproject = ... belongs to envbuild.toml only: a pyproject reads its own [project]
    message = refused(tmp_path / "c", {"pyproject.toml": '[tool.envbuild]\npyproject = "x.toml"\n'})
    assert "tool.envbuild.pyproject: unknown key" in message


@pytest.mark.parametrize(("text", "where", "problem"), [
    ('[tool.envbuild]\n\n[[tool.envbuild.targets]]\nname = "a"\n\n[[tool.envbuild.targets]]\n'
     'name = "b"\ndriver = 550\n', "pyproject.toml:8: tool.envbuild.targets[1].driver", "expected a string"),
    ('[tool.envbuild]\ngpus = "A100"\n', "pyproject.toml:2: tool.envbuild.gpus", "expected an array"),
    ('[tool.envbuild]\ngpus = ["A100", 3]\n', "pyproject.toml:2: tool.envbuild.gpus[1]", "expected a string"),
    ('[tool.envbuild]\ncompanions = "no"\n', "pyproject.toml:2: tool.envbuild.companions", "expected true"),
    ('[tool.envbuild]\ndatacenter = 1\n', "pyproject.toml:2: tool.envbuild.datacenter", "expected true"),
    ('[tool.envbuild]\nenv = ["A=1"]\n', "pyproject.toml:2: tool.envbuild.env", "expected a table"),
    ('[tool.envbuild.env]\nA = 1\n', "pyproject.toml:2: tool.envbuild.env.A", "expected a string"),
    ('[tool.envbuild]\ntargets = []\n', "pyproject.toml:2: tool.envbuild.targets", "expected one or more"),
    ('[tool.envbuild]\ntargets = ["a"]\n', "pyproject.toml:2: tool.envbuild.targets[0]", "expected a table"),
])
def test_wrong_types_name_file_line_and_key(tmp_path: Path, text: str, where: str, problem: str) -> None:
    """docs/faults.md H9"""
    message = refused(tmp_path, {"pyproject.toml": text})
    assert f"{where}: {problem}" in message


@pytest.mark.parametrize(("line", "where", "problem"), [
    ('driver = "55x"', "driver", "invalid driver version"),
    ('gpus = ["A100;rm"]', "gpus[0]", "invalid GPU name"),
    ('archs = ["sm89"]', "archs[0]", "invalid GPU architecture"),
    ('torch = "2.4 || 2.5"', "torch", "invalid torch version"),
    ('python = "three"', "python", "invalid python version"),
    ('cuda = "x"', "cuda", "invalid cuda version"),
    ('cudnn = "9;"', "cudnn", "invalid cudnn version"),
    ('ubuntu = "22.4"', "ubuntu", "invalid Ubuntu release"),
    ('variant = "cuda124"', "variant", "invalid wheel variant"),
    ('flavor = "full"', "flavor", "invalid flavor"),
    ('apt-packages = ["Git"]', "apt-packages[0]", "invalid Debian package name"),
    ('user = "root"', "user", "invalid user name"),
    ('base-image = "ubuntu"', "base-image", "is not pinned"),
    ('index-url = "ftp://x/simple"', "index-url", "invalid URL"),
    ('torch-index-url = "https://u:p@x/whl"', "torch-index-url", "credentials"),
    ('find-links = ["no-such-dir"]', "find-links[0]", "is not a directory"),
    ('env = { "1A" = "x" }', "env.1A", "invalid environment pair"),
    ('registry-mirrors = { "docker.io" = "mirror:5000" }', 'registry-mirrors."docker.io"', "invalid URL"),
    ('registry-mirrors = { "Docker IO" = "http://127.0.0.1:5000" }', 'registry-mirrors."Docker IO"',
     "invalid registry host"),
])
def test_invalid_values_use_the_flags_validators(tmp_path: Path, line: str, where: str, problem: str) -> None:
    """docs/faults.md H10"""
    message = refused(tmp_path, {"envbuild.toml": f'# a comment\n{line}\n'})
    assert f"envbuild.toml:2: {where}: " in message and problem in message


def test_targets_names_and_their_combination(tmp_path: Path) -> None:
    """docs/faults.md H17"""
    two = '[[targets]]\nname = "a"\n\n[[targets]]\nname = "a"\n'
    assert "envbuild.toml:5: targets[1].name: duplicate target name 'a'" in refused(
        tmp_path, {"envbuild.toml": two})
    assert "envbuild.toml:2: targets[0].name: invalid target name 'A100'" in refused(
        tmp_path / "b", {"envbuild.toml": '[[targets]]\nname = "A100"\n'})
    assert "envbuild.toml:1: targets[0]: a target needs a name" in refused(
        tmp_path / "c", {"envbuild.toml": '[[targets]]\ndriver = "550"\n'})
    assert "envbuild.toml:1: driver: cannot be combined with targets" in refused(
        tmp_path / "d", {"envbuild.toml": 'driver = "550"\n[[targets]]\nname = "a"\n'})
    long_name = f'[[targets]]\nname = "{"x" * 33}"\n'
    assert "invalid target name" in refused(tmp_path / "e", {"envbuild.toml": long_name})
    assert load(tmp_path / "f", {"envbuild.toml": f'[[targets]]\nname = "{"x" * 32}"\n'}).targets[0].name


@pytest.mark.parametrize(("requirement", "problem"), [
    # a directory is a local package since H53 (tests/test_requirements_as_written.py): built
    # from its sources, so one that is no Python project, or missing, is refused
    ("-e .", "local package '.' holds neither pyproject.toml nor setup.py"),
    ("--editable=./lib", "local package 'lib' does not exist"),
    (".", "local package '.' holds neither pyproject.toml nor setup.py"),
    ("./libs/thing", "local package 'libs/thing' does not exist"),
    ("-e git+https://127.0.0.1/r.git#egg=r", "editable requirement"),
    ("/abs/thing", "local package '/abs/thing' is not relative to the requirements file"),
    ("file:///abs/thing", "local path requirement"),
    ("thing @ file:///abs/thing", "local path requirement"),
    ("dist/thing-1.0-py3-none-any.whl", "local path requirement"),
])
def test_editable_and_local_requirements_are_refused(tmp_path: Path, requirement: str, problem: str) -> None:
    """docs/faults.md H11 (editable), H12 (local paths), H53 (local packages)"""
    message = refused(tmp_path, {"envbuild.toml": 'requirements = ["requirements.txt"]\n',
                                 "requirements.txt": f"requests\n# comment\n{requirement}\n"})
    assert f"requirements.txt:3: {problem}" in message


@pytest.mark.parametrize(("requirement", "problem"), [
    ("git+https://127.0.0.1/repo.git", "VCS requirement"),  # no #egg=: no name
    ("thing @ git+ssh://127.0.0.1/repo.git@v1",
     "direct requirement 'thing @ git+ssh://127.0.0.1/repo.git@v1' is not git+https or git+http"),
    ("hg+https://127.0.0.1/repo", "VCS requirement"),
    ("https://127.0.0.1/thing-1.0.tar.gz", "direct URL requirement"),
    # an https wheel, a git source, an archive are allowed (tests/test_direct_wheels.py,
    # tests/test_git_and_archives.py); anything else by URL is not
    ("thing @ http://127.0.0.1/thing-1.0-py3-none-any.whl", "direct URL requirement"),
    ("thing @ http://127.0.0.1/thing-1.0.tar.gz",
     "source archive 'thing @ http://127.0.0.1/thing-1.0.tar.gz' is fetched over plain http "
     "with no #sha256="),
    ("thing @ https://127.0.0.1/other-1.0.tar.gz",
     "source archive 'thing @ https://127.0.0.1/other-1.0.tar.gz' is one of other, not of thing"),
])
def test_vcs_and_direct_urls_are_refused(tmp_path: Path, requirement: str, problem: str) -> None:
    """docs/faults.md H13"""
    message = refused(tmp_path, {"envbuild.toml": 'requirements = ["requirements.txt"]\n',
                                 "requirements.txt": f"requests\n{requirement}\n"})
    assert f"requirements.txt:2: {problem}" in message
    # the same string in the project file is refused at its key
    message = refused(tmp_path / "b",
                      {"envbuild.toml": f'dependencies = [\n  "rich",\n  "{requirement}",\n]\n'})
    assert f"envbuild.toml:1: dependencies[1]: {problem}" in message
    message = refused(tmp_path / "c", {"pyproject.toml": '[project]\nname = "x"\n'
                                                         f'dependencies = ["{requirement}"]\n'
                                                         "[tool.envbuild]\n"})
    assert f"pyproject.toml:3: project.dependencies: {problem}" in message


@pytest.mark.parametrize("option", ["--index-url https://127.0.0.1/simple", "-i https://127.0.0.1/simple",
                                    "--extra-index-url=https://127.0.0.1/simple",
                                    "--find-links wheels", "--pre"])
def test_pip_options_other_than_r_are_refused(tmp_path: Path, option: str) -> None:
    """docs/faults.md H14 (-c is read since H51: tests/test_requirements_as_written.py)"""
    message = refused(tmp_path, {"envbuild.toml": 'requirements = ["requirements.txt"]\n',
                                 "requirements.txt": f"{option}\nrequests\n"})
    assert f"requirements.txt:1: pip option {option.split()[0].split('=')[0]} is not allowed here" in message
    assert "project file" in message


def test_invalid_pep508_requirement(tmp_path: Path) -> None:
    message = refused(tmp_path, {"envbuild.toml": 'requirements = ["r.txt"]\n', "r.txt": "requests >= \n"})
    assert "r.txt:1: invalid requirement 'requests >='" in message
    message = refused(tmp_path / "b", {"envbuild.toml": 'requirements = ["r.txt"]\n',
                                       "r.txt": "idna\nrequests==2.31.0 --hash=sha256:00\n"})
    assert "r.txt:2: --hash 'sha256:00' is not sha256:<64 hex digits>" in message  # H52


def test_missing_requirements_file_names_the_line_that_names_it(tmp_path: Path) -> None:
    """docs/faults.md H15"""
    message = refused(tmp_path, {"envbuild.toml": 'torch = "2.4"\nrequirements = ["nope.txt"]\n'})
    assert "envbuild.toml:2: requirements[0]: requirements file nope.txt does not exist" in message
    message = refused(tmp_path / "b", {"envbuild.toml": 'requirements = ["sub/a.txt"]\n',
                                       "sub/a.txt": "requests\n-r gone.txt\n"})
    assert "sub/a.txt:2: requirements file sub/gone.txt does not exist" in message


def test_includes_are_relative_to_the_including_file_and_cycles_end(tmp_path: Path) -> None:
    project = load(tmp_path, {
        "envbuild.toml": 'requirements = ["reqs/base.txt"]\n',
        "reqs/base.txt": "-r extra/more.txt\nrequests  # the http library\n",
        "reqs/extra/more.txt": "--requirement ../base.txt\n-r../base.txt\n"
                               "idna \\\n  >=3 \\\n  ;python_version>'3'\n"})
    assert project.dependencies == ("idna >=3 ;python_version>'3'", "requests")
    assert project.sources == ("envbuild.toml", "reqs/base.txt", "reqs/extra/more.txt")


def test_logical_lines_join_continuations_and_drop_comments() -> None:
    text = "# top\na # x\nb \\\n c\n\n#c\\\nd#not-a-comment\ne \\\n"
    assert list(logical_lines(text)) == [(2, "a"), (3, "b c"), (7, "d#not-a-comment"), (8, "e")]


def test_inputs_digest_follows_the_files_read_and_nothing_else(tmp_path: Path) -> None:
    files = {"envbuild.toml": 'requirements = ["r.txt"]\n', "r.txt": "-r s.txt\n", "s.txt": "requests\n"}
    first = load(tmp_path, files).inputs_digest
    (tmp_path / "unrelated.txt").write_text("rich\n")
    assert load_project(None, tmp_path).inputs_digest == first
    (tmp_path / "s.txt").write_text("requests  # same requirement, new bytes\n")
    second = load_project(None, tmp_path).inputs_digest
    assert second != first
    (tmp_path / "s.txt").write_text("requests\n")
    assert load_project(None, tmp_path).inputs_digest == first
    (tmp_path / "envbuild.toml").write_text('requirements = ["r.txt"]  # a comment\n')
    assert load_project(None, tmp_path).inputs_digest != first
    # the same bytes in another directory: the same digest (paths are relative)
    assert load(tmp_path / "copy", files).inputs_digest == first


def test_extras_and_groups_problems(tmp_path: Path) -> None:
    """docs/faults.md H19"""
    base = '[project]\nname = "demo"\n[project.optional-dependencies]\ngpu = ["numpy"]\n' \
           '[dependency-groups]\ndev = [{include-group = "lint"}]\nlint = [{include-group = "dev"}]\n'
    message = refused(tmp_path, {"pyproject.toml": base + '[tool.envbuild]\nextras = ["gpus"]\n'})
    assert "pyproject.toml:9: tool.envbuild.extras: unknown extra 'gpus'" in message
    assert "did you mean 'gpu'?" in message
    message = refused(tmp_path / "b", {"pyproject.toml": base + '[tool.envbuild]\ngroups = ["dev"]\n'})
    assert "dependency group cycle: dev -> lint -> dev" in message
    message = refused(tmp_path / "c", {"pyproject.toml": base + '[tool.envbuild]\ngroups = ["docs"]\n'})
    assert "tool.envbuild.groups: unknown dependency group 'docs'" in message
    message = refused(tmp_path / "d", {"envbuild.toml": 'extras = ["gpu"]\n'})
    assert "envbuild.toml:1: extras: needs a pyproject.toml" in message
    message = refused(tmp_path / "e", {"pyproject.toml": '[project]\nname = "d"\ndynamic = ["dependencies"]\n'
                                                         "[tool.envbuild]\n"})
    assert "pyproject.toml:3: project.dynamic: dynamic dependencies cannot be read" in message
    message = refused(tmp_path / "f", {"envbuild.toml": 'pyproject = "pyproject.toml"\n'})
    assert "envbuild.toml:1: pyproject: pyproject.toml does not exist" in message


def test_group_names_are_normalized(tmp_path: Path) -> None:
    project = load(tmp_path, {"pyproject.toml": '[dependency-groups]\nMy_Tests = ["pytest"]\n'
                                                '[tool.envbuild]\ngroups = ["my-tests"]\n'})
    assert project.dependencies == ("pytest",)


def test_output_is_sorted_and_deterministic(tmp_path: Path) -> None:
    files = {"envbuild.toml": 'dependencies = ["zlib-ng", "attrs", "Zope", "attrs"]\n'}
    project = load(tmp_path, files)
    assert project.dependencies == ("Zope", "attrs", "zlib-ng")
    assert load(tmp_path / "again", files).dependencies == project.dependencies


def test_line_locator() -> None:
    text = ('[project]\nname = "x"\n\n[tool.envbuild]\ntorch = "2"\n"quoted" = 1\n'
            'env.A = "1"\n\n[[tool.envbuild.targets]]\nname = "a"\n\n[[tool.envbuild.targets]]\n'
            'name = "b"\n  driver = "5"\n[tool.envbuild.mirrors]\nB = "2"\n')
    assert line_of(text, ["tool", "envbuild", "torch"]) == 5
    assert line_of(text, ["tool", "envbuild", "quoted"]) == 6
    assert line_of(text, ["tool", "envbuild", "env", "A"]) == 7
    assert line_of(text, ["tool", "envbuild", "targets", 1, "driver"]) == 14
    assert line_of(text, ["tool", "envbuild", "targets", 1, "gpus"]) == 12  # absent: the header
    assert line_of(text, ["tool", "envbuild", "mirrors", "B"]) == 16
    assert line_of(text, ["tool", "envbuild", "mirrors", "C"]) == 15
    assert line_of(text, ["project", "name"]) == 2
    assert line_of(text, ["nothing"]) == 1
    assert dotted(["tool", "envbuild", "targets", 1, "driver"]) == "tool.envbuild.targets[1].driver"
    assert dotted(["registry-mirrors", "docker.io"]) == 'registry-mirrors."docker.io"'


def test_not_utf8_and_directory(tmp_path: Path) -> None:
    (tmp_path / "envbuild.toml").write_bytes(b'torch = "\xff"\n')
    assert "envbuild.toml:1: not UTF-8" in refused(tmp_path, {})
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "envbuild.toml").mkdir()
    assert "is a directory" in refused(tmp_path / "d", {})
