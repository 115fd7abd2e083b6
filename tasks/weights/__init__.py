"""Step 2 of the pipeline: pretrained weights staged once to the bucket.

``source`` (what a weights source is, light enough for the parameters to check one) and
``stage`` (fetch once on the driver, store under the file's sha256, reuse by source identity).
"""
