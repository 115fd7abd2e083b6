"""Image inputs as preprocessing and scoring both read them: listed on the driver, fetched and
decoded on the executors, what cannot be used quarantined with its reason.

``listing`` (class-folder trees, local via ``walk`` or ``s3://``, and MNIST IDX files, as
``Item``s), ``fetch`` (a task's ``Fetcher``), ``decode`` (``sniff``: what a non-image is),
``partitions``, ``parquet``, ``quarantine``, ``checks`` (what both steps' parameters accept).
This ``__init__`` imports none of them.
"""
