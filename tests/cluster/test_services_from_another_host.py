"""The embedded services bound for a cluster, asked from another host: no key, no answer."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

# Runs on a worker host (its own network, disk and clean environment). argv: the services' URLs
# as JSON, then the credentials as JSON or "none". Prints each service's HTTP status as JSON.
PROBE = textwrap.dedent(
    """
    import base64, json, sys, urllib.error, urllib.request

    urls, creds = json.loads(sys.argv[1]), json.loads(sys.argv[2])

    def status(url, method="GET", headers=None, body=None):
        request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    def basic(user_password):
        return {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}

    found = {}
    if creds is None:
        found["s3"] = status(urls["s3"] + "/")  # ListBuckets, unsigned
    else:
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            endpoint_url=urls["s3"],
            region_name="us-east-1",
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        found["s3"] = s3.list_buckets()["ResponseMetadata"]["HTTPStatusCode"]
    mlflow_login = {}
    prefect_login = {}
    if creds is not None:
        mlflow_login = basic(
            creds["MLFLOW_TRACKING_USERNAME"] + ":" + creds["MLFLOW_TRACKING_PASSWORD"]
        )
        prefect_login = basic(creds["PREFECT_API_AUTH_STRING"])
    found["mlflow"] = status(
        urls["mlflow"] + "/api/2.0/mlflow/experiments/search?max_results=1", headers=mlflow_login
    )
    found["prefect"] = status(
        urls["prefect"] + "/flows/filter",
        method="POST",
        headers={"Content-Type": "application/json", **prefect_login},
        body=b"{}",
    )
    print(json.dumps(found))
    """
)


@pytest.mark.timeout(420)
def test_services_bound_for_the_cluster_refuse_a_host_without_credentials(
    netns_cluster, tmp_path, monkeypatch
):
    from hvdflow.infra.services.local import LocalServices

    for name in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)  # start all three, not the session's
    services = LocalServices(tmp_path / "home")
    try:
        env = services.up(bind=netns_cluster.driver_ip)
        urls = services.urls()
        assert all(f"//{netns_cluster.driver_ip}:" in urls[k] for k in ("s3", "mlflow", "prefect"))

        def probe(creds) -> dict:
            done = netns_cluster.run_on_host(
                netns_cluster.hosts[0],
                [sys.executable, "-c", PROBE, json.dumps(urls), json.dumps(creds)],
                timeout_s=120,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            return json.loads(done.stdout.strip().splitlines()[-1])

        assert probe(None) == {"s3": 403, "mlflow": 401, "prefect": 401}
        wrong = {k: "wrong" for k in env}
        wrong["PREFECT_API_AUTH_STRING"] = "admin:wrong"
        with pytest.raises(AssertionError, match="InvalidAccessKeyId|SignatureDoesNotMatch"):
            probe(wrong)  # boto3 raises on the refused signature
        wrong_http = {**env, "MLFLOW_TRACKING_PASSWORD": "wrong", "PREFECT_API_AUTH_STRING": "x:y"}
        found = probe(wrong_http)
        assert (found["mlflow"], found["prefect"]) == (401, 401)
        assert probe(env) == {"s3": 200, "mlflow": 200, "prefect": 200}
    finally:
        services.down()
    assert not os.path.exists(services.state_path)
