"""TLS for the MQTT listeners (mqtts on 8883, wss): one server `ssl.SSLContext` from PEM files."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving the PEM certificate chain in ``cert_file`` with ``key_file``.

    Raises `ValueError` naming the file when either is missing, unreadable or not usable.
    """
    for role, name in (("certificate", cert_file), ("private key", key_file)):
        try:
            Path(name).read_bytes()
        except OSError as exc:
            raise ValueError(f"TLS {role} file {name!r} cannot be read ({exc.strerror}): "
                             f"point the setting at a readable PEM file") from exc
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file, password=lambda: _encrypted(key_file))
    except ssl.SSLError as exc:
        raise ValueError(f"TLS certificate {cert_file!r} with private key {key_file!r} cannot be used "
                         f"({exc.reason}): both must be PEM, the certificate first in its chain, "
                         f"and the key must belong to the certificate") from exc
    return context


def _encrypted(key_file: str) -> bytes:
    raise ValueError(f"TLS private key {key_file!r} is encrypted: give the server an unencrypted PEM key "
                     f"(e.g. `openssl pkey -in KEY -out PLAIN`) readable only by its user")
