"""envbuild: reproducible GPU environments, resolved from the host driver up."""

from __future__ import annotations

__version__ = "0.1.0"
