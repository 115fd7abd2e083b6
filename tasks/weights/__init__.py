"""Step 2 of the pipeline: pretrained weights staged once to the bucket.

- ``source``: what a weights source is (the offline one; a source as records show it), light
  enough for the parameters to check one
- ``stage``: fetch once on the driver, store under the file's sha256, reuse by source identity

Orchestrators wrap ``stage`` in their own task (``hvdflow.flows``).
"""
