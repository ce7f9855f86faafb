"""``python -m pipelines.train ARGS`` (the same as ``specdec train ARGS``)."""

from pipelines.train.cli import main

raise SystemExit(main())
