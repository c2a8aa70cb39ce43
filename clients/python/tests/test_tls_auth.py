"""TLS and credentials: a broker with a certificate (made here, with a throwaway CA) and a users
file (made with ``mqd user add``), reached with user/password and with a bearer token."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import mq_client
from mq_client import Client

from conftest import Mqd, mqd_path

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: "Tuple[str, ec.EllipticCurvePrivateKey] | None",
) -> "x509.Certificate":
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name = (
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]) if issuer else name
    )
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if issuer is None:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        b = b.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    return b.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(c: "x509.Certificate") -> bytes:
    return c.public_bytes(serialization.Encoding.PEM)


def _key_pem(k: ec.EllipticCurvePrivateKey) -> bytes:
    return k.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class SecureBroker:
    def __init__(self, mqd: Mqd, ca_path: Path, token: str) -> None:
        self.mqd = mqd
        self.url = "https://" + mqd.addr
        self.ca_path = ca_path
        self.ca_pem = ca_path.read_bytes()
        self.token = token


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    d = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("mq test CA", ca_key, None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("localhost", key, ("mq test CA", ca_key))
    (d / "ca.pem").write_bytes(_pem(ca))
    (d / "server.pem").write_bytes(_pem(cert))
    (d / "server.key").write_bytes(_key_pem(key))
    users = d / "users.toml"
    out = subprocess.run(
        [
            str(mqd_path()),
            "user",
            "add",
            "--users",
            str(users),
            "alice",
            "--rights",
            "create-queue,send,receive,peek,admin",
            "--token",
        ],
        env={**os.environ, "MQD_PASSWORD": "s3cret"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = next(w for w in out.stdout.split() if w.startswith("mqt_"))
    broker = Mqd(
        [
            "--tls-cert",
            str(d / "server.pem"),
            "--tls-key",
            str(d / "server.key"),
            "--users",
            str(users),
        ]
    )
    try:
        yield SecureBroker(broker, d / "ca.pem", token)
    finally:
        broker.stop()


def test_tls_with_user_and_password(secure: SecureBroker) -> None:
    with Client(secure.url, ca=secure.ca_pem, user="alice", password="s3cret") as c:
        name = ".\\private$\\py-tls-" + uuid.uuid4().hex[:8]
        c.create_queue(name)
        q = c.queue(name)
        sent = q.send(b"secret order", recoverable=True)
        got = q.receive_one(timeout=30.0)
        assert got is not None and got.id == sent and got.body == b"secret order"
        assert got.sender == "alice"
        c.delete_queue(name)


def test_tls_with_token_and_ca_file(secure: SecureBroker) -> None:
    with Client(secure.url, ca=str(secure.ca_path), token=secure.token) as c:
        assert c.broker_info().protocol_version == mq_client.PROTOCOL_VERSION


def test_bad_password_is_unauthenticated(secure: SecureBroker) -> None:
    with pytest.raises(mq_client.Unauthenticated):
        Client(secure.url, ca=secure.ca_pem, user="alice", password="wrong")


def test_untrusted_certificate_is_a_connect_error(secure: SecureBroker) -> None:
    other_ca = _cert("another CA", ec.generate_private_key(ec.SECP256R1()), None)
    with pytest.raises(mq_client.ConnectError):
        Client(secure.url, ca=_pem(other_ca), token=secure.token, connect_timeout=1.0)


def test_domain_names_the_certificate_host(secure: SecureBroker) -> None:
    with Client(secure.url, ca=secure.ca_pem, token=secure.token, domain="localhost") as c:
        assert c.broker_info().protocol_version == mq_client.PROTOCOL_VERSION
    with pytest.raises(mq_client.ConnectError, match="domain"):
        Client(
            secure.url,
            ca=secure.ca_pem,
            token=secure.token,
            domain="other.example",
            connect_timeout=1.0,
        )
