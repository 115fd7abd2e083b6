"""A multi-host test harness on one Linux machine (issue #12): simulated hosts in namespaces.

- ``netns``: the hosts (network namespaces on a bridge, own hostname, own /tmp).
- ``spark_cluster``: a Spark standalone master and one worker per host on them.
- ``driver``: runs a Spark driver for that cluster in a process of its own.
- ``registry``, ``cleanup``, ``processes``: run records, removal of leftovers, bounded stops.
- ``fixtures``: the session fixture ``netns_cluster``.

By hand, as root: ``python -m tests.cluster up`` / ``down`` / ``status``.
"""
