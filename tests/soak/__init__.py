"""A soak (issue #44): the deployed pipeline run many times on the multi-host harness, with the
services, the deployments and a Prefect worker started once and kept up, while a seeded
schedule injects real faults; after every run and at the end it checks, from the outside, that
nothing was lost, corrupted or left behind.

- ``plan``: the fault kinds and the seeded schedule (which run gets which fault, and when).
- ``stack``: the long-lived parts (cluster, services, deployment, worker) and their restarts.
- ``faults``: the hands that break things, one kind each.
- ``checks``: what is looked at after each run and at the end.
- ``runner``: the loop; ``report``: the table for docs/benchmarks/cluster.md ("Soak").

By hand, as root, from the project root: ``python -m tests.soak --runs 24 --seed 44``.
CI runs a short one (``test_soak.py``).
"""
