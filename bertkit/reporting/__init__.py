"""bertkit-report: read the results of runs and sweeps (metrics.json, failed.json, W&B offline
logs), summarise over seeds, test significance, and write paper-shaped tables and plots.

Imports `bertkit.data` and `bertkit.config_tree` (to find the tasks' main metrics) only:
reporting never runs or imports training code.
"""
