"""The whole Python closure of an environment, as a PEP 751 ``pylock.toml``.

- :mod:`envbuild.pylock.uv` runs uv's cross-platform ``pip compile`` over a generated
  project (the stack's torch pins routed to the variant's index, the user's dependencies
  from the default index) and returns the pylock text, every pinned version and the
  names that make up the torch layer.
- :mod:`envbuild.pylock.files` reads and validates a pylock: lock-version 1.0, every file
  with a URL or path and a sha256.
- :mod:`envbuild.pylock.install` turns a pylock into hash-pinned requirement lines for
  ``pip install --no-deps --require-hashes``, choosing the best wheel for the target's
  CPython and glibc, and lists the local wheels a build context must carry.
- :mod:`envbuild.pylock.hashes` checks that the index itself gave the sha256 of every
  file uv chose (uv would otherwise download the file and hash what it received).

Nothing here writes files outside a temporary directory; callers write the pylock with
:func:`envbuild.fs.write_file`.
"""
