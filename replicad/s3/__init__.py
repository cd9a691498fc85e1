"""The one owner of the S3 client library (boto3): the rest of replicad sees :class:`S3Client`, our
:class:`S3Endpoint` and our errors."""

from replicad.s3.client import NoSuchKeyError, ObjectInfo, S3Client, S3Error
from replicad.s3.endpoint import S3Endpoint

__all__ = ["NoSuchKeyError", "ObjectInfo", "S3Client", "S3Endpoint", "S3Error"]
