"""The guided demo that ships with jobs-core: ``jobsctl demo``.

:mod:`jobs_core.demo.shop` is a small example shop app (its jobs, and stand-ins for the payment
provider, warehouse, vendor payouts and mail it talks to); :mod:`jobs_core.demo.run` enqueues a
scenario, runs a real :class:`~jobs_core.worker.Worker` over it, narrates what happens and checks
that every job ended as the story says.
"""
