"""Object storage, one room: any S3-compatible server through boto3, and local folders alike.

- ``uris``: the one ``s3://`` parser, and joins and URLs for folders and prefixes alike
- ``access``: ``S3Access``, the endpoint and keys as one picklable value, and the one factory
  for boto3 clients (the driver's, the executors', the ranks')
- ``files``: ``Location`` and ``open_for_write``, files under a folder or prefix written whole
- ``object_store``: ``ObjectStore``, the driver's bucket, with errors that say what to fix
- ``locks``: locks shared by one machine's processes
"""
