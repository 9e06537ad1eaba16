"""Fixtures for the MQTT transport tests: a self-signed certificate for 127.0.0.1."""
from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class CertFiles(NamedTuple):
    cert: str
    key: str


def write_self_signed_cert(folder: Path) -> CertFiles:
    """Write ``cert.pem`` and ``key.pem`` for a self-signed 127.0.0.1 certificate into ``folder``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    files = CertFiles(str(folder / "cert.pem"), str(folder / "key.pem"))
    Path(files.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(files.key).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return files


@pytest.fixture
def make_cert_files(tmp_path: Path) -> Callable[[str], CertFiles]:
    """``make_cert_files(name)``: a fresh self-signed 127.0.0.1 certificate in ``tmp_path/name``."""
    def make(name: str) -> CertFiles:
        (tmp_path / name).mkdir()
        return write_self_signed_cert(tmp_path / name)
    return make


@pytest.fixture
def cert_files(make_cert_files: Callable[[str], CertFiles]) -> CertFiles:
    """A fresh self-signed certificate and key for 127.0.0.1, as PEM file paths."""
    return make_cert_files("tls")
