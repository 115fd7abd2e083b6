"""Step 2 of the pipeline: pretrained weights staged once to the bucket.

- ``stage``: fetch once on the driver, store under the file's sha256, reuse by source identity
- ``steps``: the Prefect task around it (retries on the object store, a cache that follows the
  source)
"""
