"""Allow `python -m arena` as well as the `arena` console script."""

from arena.cli import main

raise SystemExit(main())
