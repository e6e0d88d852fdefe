"""Image registries: references (``reference``), Docker's credentials (``credentials``), the
one HTTP client that speaks the Registry API v2 with them (``client``), the digest ``lock``
pins a base to (``digest``) and the tag ``promote`` gives a verified digest (``promote``)."""
