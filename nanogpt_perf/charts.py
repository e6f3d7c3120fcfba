"""Moved to lab/charts.py (issue 43): this name stays only until its last importers follow."""

from lab.charts import *  # noqa: F403
from lab.charts import NO_MATPLOTLIB, close, figure, pyplot, save  # noqa: F401
