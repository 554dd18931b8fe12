"""``python -m fxckpt``: the same command line as ``fxckpt``."""

from fxckpt.cli import main

raise SystemExit(main())
