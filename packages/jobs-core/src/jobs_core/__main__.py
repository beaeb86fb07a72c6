"""``python -m jobs_core``: the ``jobsctl`` command without its console script."""

from jobs_core.cli import main

main()
