"""Deleting a job's objects from its S3 bucket (``spec.output.s3.cleanupOnDelete``)."""

from __future__ import annotations

import base64
import logging

import boto3  # in the operator's own install (sharetune[operator]): tests/operator/test_operator_install.py
from kubernetes import client

from ..api.spec import S3Output
from ..api.topology import s3_job_prefix

log = logging.getLogger("sharetune.operator")


def delete_s3_objects(api: client.ApiClient, namespace: str, job: str, s3: S3Output) -> int:
    """Deletes every object under the job's prefix, with the credentials of the job's own Secret;
    returns how many."""
    secret = client.CoreV1Api(api).read_namespaced_secret(s3.secret_name, namespace)
    data = secret.data or {}
    bucket = boto3.client("s3", endpoint_url=s3.endpoint or None, region_name=s3.region,
                          aws_access_key_id=base64.b64decode(data[s3.access_key_id_key]).decode(),
                          aws_secret_access_key=base64.b64decode(data[s3.secret_access_key_key]).decode())
    # The job's objects are <prefix>/<namespace>/<job>/...: the trailing slash keeps a job named
    # "a" from taking the objects of a job named "ab" with it.
    prefix = s3_job_prefix(s3.prefix, namespace, job) + "/"
    deleted = 0
    for page in bucket.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            bucket.delete_object(Bucket=s3.bucket, Key=obj["Key"])
            deleted += 1
    log.info("deleted %d objects under s3://%s/%s", deleted, s3.bucket, prefix)
    return deleted
