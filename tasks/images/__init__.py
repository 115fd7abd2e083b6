"""Image inputs as preprocessing and scoring both read them: listed on the driver, fetched and
decoded on the executors, what cannot be used quarantined with its reason.

- ``listing``: what to read, from names alone: a class-folder tree (local, ``walk``, or
  ``s3://``) or MNIST IDX files, as ``Item``s
- ``fetch``: a task's ``Fetcher`` (local reads, ``s3://`` GETs fetched ahead, IDX ranges, Parquet
  row groups) and the errors that fail a job instead of one input
- ``decode``: bytes to ``Good`` or ``Bad`` records (``sniff``: what a file that is no image is)
- ``partitions``: items spread over tasks, and the tasks' part file names
- ``parquet``: Parquet files of images, read by row group and written by part
- ``quarantine``: the unusable inputs' report, and the limit on them
- ``checks``: what both steps' parameters accept (image sizes, inputs and outputs)

Nothing here is imported by this ``__init__``: the modules load only what they use.
"""
