"""The user's project file: ``envbuild.toml`` or ``[tool.envbuild]`` in pyproject.toml.

``model.py`` holds the values (``Target``, ``Project``), ``toml.py`` the TOML reader and the
line locator every error message uses, ``config.py`` discovery and validation
(``load_project``), ``requirements.py`` the user's dependencies (pyproject dependencies,
extras, dependency groups, requirements files) and ``init.py`` the text ``envbuild init``
writes. Pure library code: no argparse, no printing.
"""

# What a build may install the closure with (project key "installer", lock --installer); here,
# not in model.py, so that `envbuild lock --help` reads it without importing the project model.
INSTALLER_CHOICES = ("uv", "pip")
