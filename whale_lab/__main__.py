"""`python -m whale_lab`: the same command line as `whale-lab`."""

from __future__ import annotations

from whale_lab.cli import main

raise SystemExit(main())
