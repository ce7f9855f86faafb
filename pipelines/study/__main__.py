"""``python -m pipelines.study --config FILE ...`` (the same as ``specdec study``)."""

import sys

from pipelines.study.pipeline import main

sys.exit(main())
