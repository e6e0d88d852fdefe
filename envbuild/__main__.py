from __future__ import annotations

from envbuild.cli import main

raise SystemExit(main())
