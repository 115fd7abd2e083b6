"""Object storage (boto3, any S3-compatible server) and locks shared by one machine's processes."""
