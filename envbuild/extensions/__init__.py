"""Extensions built against the locked torch: local source directories a project declares
(``extensions = ["ext"]``), built into wheels in a build stage of the image.

- :mod:`envbuild.extensions.tree` checks a declared directory (inside the project, holding a
  ``pyproject.toml`` or ``setup.py``), reads its source tree as hostile input (regular files
  only, no links, bounded) and hashes it: the sha256 the lock records.
- :mod:`envbuild.extensions.stage` turns a lock's extensions into the build context's files
  and the Dockerfile's build-stage values (``TORCH_CUDA_ARCH_LIST`` from the stack's arch list).

- :mod:`envbuild.extensions.sdists`: requirements only an sdist provides (``build-sdists``),
  locked by the sdist's sha256 and built in the same stage.
- :mod:`envbuild.extensions.classify`: which of those sdists are pure Python (read from the
  archive at lock time, never run): they are built in a stage without the torch layer.
- :mod:`envbuild.extensions.record`: the built wheels' sha256 by build key (source sha256,
  torch, CUDA, arch list, Python) in ``envbuild.built.json`` beside the lock.

The built wheel is made at image build time, so the lock records the source's sha256, not the
wheel's; the build stage prints each built wheel's sha256, the image keeps them in
``/opt/envbuild/extension-wheels.sha256`` and ``build`` records them beside the lock.
"""
