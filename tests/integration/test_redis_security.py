"""Redis with a password and TLS only: workers, sinks, checkpoints and a CCR migration work over
`rediss://:PASSWORD@host:port/0?ssl_ca_certs=CA`, and a wrong password is one clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from test_migration import EVENTS, check_exactly_once, load
from test_migration_faults import plan_for

from elastream.control.checkpoint_driver import CheckpointDriver
from elastream.control.migration import MigrationDriver
from elastream.handlers.main import redis_at_start
from elastream.store.registry import RedisCredentialsRefused, RedisUnavailable, connect
from support.harness import running, with_audit, write_manifest
from support.ports import free_port

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-for-tests"


def make_certificates(directory: str) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl)."""
    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr, crt = (os.path.join(directory, f"server.{ext}") for ext in ("key", "csr", "crt"))
    ext = os.path.join(directory, "san.cnf")
    with open(ext, "w", encoding="utf-8") as handle:
        handle.write("subjectAltName=IP:127.0.0.1\n")
    run = ["openssl"]
    for args in (
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=elastream-test-ca",
            "-keyout",
            ca_key,
            "-out",
            ca_crt,
        ],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            crt,
        ],
    ):
        subprocess.run(run + args, check=True, capture_output=True)
    return ca_crt, crt, key


@pytest.fixture
def secure_redis(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: `make setup` installs it (the TLS test needs it)")
    ca, crt, key = make_certificates(str(tmp_path))
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            crt,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            PASSWORD,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    try:
        connect(url, wait_s=10.0).close()
        yield url, port, ca
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_topology_migrates_exactly_once_over_tls_with_a_password(secure_redis, tmp_path) -> None:
    url, _, _ = secure_redis
    path = write_manifest(str(tmp_path), with_audit(load("ccr-diamond"), EVENTS))
    with running(path, url) as (cluster, topology):
        for worker in cluster.workers.values():  # the password is not on any command line
            assert PASSWORD not in " ".join(worker.process.args)
        time.sleep(1.0)
        assert CheckpointDriver(topology, cluster, cluster.client).take().outcome == "completed"
        new = plan_for(topology, cluster.current_schedule(), topology.nodes + 1)
        report = MigrationDriver(topology, cluster, cluster.client, "ccr").migrate(new)
        assert report.outcome == "succeeded", report.reason
        check_exactly_once(cluster, topology)


def test_a_wrong_password_or_plain_text_is_one_clear_error(secure_redis) -> None:
    _, port, ca = secure_redis
    with pytest.raises(RedisUnavailable, match=r"refused the credentials.*fix the password") as refused:
        connect(f"rediss://:wrong-secret@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    assert "wrong-secret" not in str(refused.value) and ":***@127.0.0.1" in str(refused.value)
    with pytest.raises(RedisCredentialsRefused):  # the operator exits on it: waiting would not help
        redis_at_start(f"rediss://:wrong-secret@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    # unreachable with a password in the URL: the message says where, never the password
    with pytest.raises(RedisUnavailable, match=r"cannot reach Redis at redis://:\*\*\*@127.0.0.1:1/0") as away:
        connect("redis://:hunter2-secret@127.0.0.1:1/0", wait_s=0.2)
    assert "hunter2-secret" not in str(away.value)
    with pytest.raises(RedisUnavailable, match=f"cannot reach Redis at redis://127.0.0.1:{port}/0"):
        connect(f"redis://127.0.0.1:{port}/0", wait_s=0.5)
