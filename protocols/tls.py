"""TLS for every listener: the ``[tls]`` settings and the one live server certificate.

`ServerTls` loads the certificate and key once, hands every TLS listener its `ssl.SSLContext`
(MQTT TLS and WSS, AMQP TLS, the admin HTTPS port) and, on ``reload``, loads the files again
into those same contexts: handshakes from then on get the new certificate, connections open
before go on with the one they negotiated. The gRPC listener reads ``chain()`` instead (grpc
takes PEM bytes, not contexts). A verified client certificate names its user by its subject's
common name (``certificate_user``). Loading blocks on file reads: run it at start or on SIGHUP.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509

log = logging.getLogger(__name__)

ClientCerts = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class TlsConfig:
    """One certificate for every TLS listener: MQTT TLS and WSS, AMQP TLS, the admin HTTPS port
    and native gRPC. SIGHUP reloads ``cert`` and ``key`` without dropping connections."""

    cert: str | None = None
    """PEM certificate chain (server certificate first) served by every TLS listener; with
    ``key`` it opens the MQTT TLS/WSS and AMQP TLS listeners and turns on HTTPS for the admin
    port and TLS for the native port (``admin.tls``, ``native.tls``)."""
    key: str | None = None
    """PEM private key of ``cert``, unencrypted, readable only by the broker's user."""
    client_ca: str | None = None
    """PEM file of the CA certificates that client certificates must be signed by; needed when
    ``client_certs`` is not "none"."""
    client_certs: ClientCerts = "none"
    """Client certificates on the MQTT TLS/WSS and AMQP TLS listeners: "none" asks for none;
    "optional" verifies one when the client sends it (against ``client_ca``) and lets clients
    without one log in with a password; "required" refuses a TLS handshake without a valid one.
    A verified certificate logs in as the user its subject's CN names (``cert_login``)."""
    cert_login: bool = True
    """Whether a verified client certificate logs in as the user named by its CN (MQTT without a
    password, AMQP by SASL EXTERNAL); false: the certificate only admits the connection and the
    client still logs in with a user name and password."""

    @property
    def enabled(self) -> bool:
        """Whether a certificate is configured."""
        return bool(self.cert and self.key)

    @property
    def verifies_clients(self) -> bool:
        """Whether client certificates are asked for."""
        return self.enabled and self.client_certs != "none"


def check_settings(config: TlsConfig) -> str | None:
    """What is wrong with ``config`` (a sentence saying what to set), or None."""
    if bool(config.cert) != bool(config.key):
        return "tls.cert and tls.key must be set together (--tls-cert PEM --tls-key PEM)"
    if config.client_certs != "none" and not config.enabled:
        return (f"tls.client_certs = {config.client_certs!r} needs a server certificate: set "
                "tls.cert and tls.key")
    if config.client_certs != "none" and not config.client_ca:
        return (f"tls.client_certs = {config.client_certs!r} needs tls.client_ca (--tls-client-ca "
                "PEM), the CA that signs client certificates")
    return None


class ServerTls:
    """The server certificate of every TLS listener, reloadable in place. Thread-safe."""

    def __init__(self, config: TlsConfig) -> None:
        """Load ``config``'s files; ValueError names the file and what is wrong with it."""
        assert config.cert and config.key, "ServerTls needs tls.cert and tls.key"
        self.config = config
        self._lock = threading.Lock()
        self._contexts: list[ssl.SSLContext] = []
        self._chain, self.certificate = _read_pair(config.cert, config.key)
        self.generation = 0
        """Grows by one at each successful reload."""

    def context(self, *, client_certs: bool = False) -> ssl.SSLContext:
        """A new TLS 1.2+ server context with the current certificate, kept for ``reload``;
        ``client_certs``: ask for client certificates as ``tls.client_certs`` says."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        config = self.config
        if client_certs and config.verifies_clients:
            assert config.client_ca is not None
            try:
                context.load_verify_locations(cafile=config.client_ca)
            except (OSError, ssl.SSLError) as error:
                raise ValueError(f"tls.client_ca {config.client_ca!r} cannot be used ({error}): "
                                 "point it at a readable PEM file of CA certificates") from None
            context.verify_mode = (ssl.CERT_REQUIRED if config.client_certs == "required"
                                   else ssl.CERT_OPTIONAL)
        with self._lock:
            _load(context, config.cert, config.key)  # type: ignore[arg-type]
            self._contexts.append(context)
        return context

    def chain(self) -> tuple[bytes, bytes, int]:
        """(certificate chain PEM, key PEM, generation) as last loaded."""
        with self._lock:
            return self._chain[0], self._chain[1], self.generation

    def reload(self) -> str:
        """Read the certificate and key files again and serve them to new handshakes.

        Returns a line saying what is served now; ValueError (the old certificate stays) when
        the new files cannot be used. Blocks on file reads."""
        config = self.config
        chain, certificate = _read_pair(config.cert, config.key)  # type: ignore[arg-type]
        with self._lock:
            for context in self._contexts:
                _load(context, config.cert, config.key)  # type: ignore[arg-type]
            self._chain, self.certificate = chain, certificate
            self.generation += 1
        return describe(certificate)


def peer_context(config: TlsConfig) -> ssl.SSLContext:
    """A client context for connecting to another node that serves ``config``'s certificate:
    it trusts ``client_ca``, else the certificate itself (no chain to a root needed), and
    checks the host name as any client does."""
    context = ssl.create_default_context(cafile=config.client_ca or config.cert)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def describe(certificate: x509.Certificate) -> str:
    """Subject, serial number and expiry of ``certificate``, for the log."""
    return (f"{certificate.subject.rfc4514_string()} (serial {certificate.serial_number:x}, "
            f"valid until {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)")


def expired(certificate: x509.Certificate) -> bool:
    """Whether ``certificate`` is outside its validity period now."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc


def certificate_user(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The common name of the peer's verified certificate, or None (no TLS, no certificate, or
    one not verified)."""
    if ssl_object is None:
        return None
    peer = ssl_object.getpeercert()  # {} unless the certificate was verified
    for rdn in (peer or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return value
    return None


def _read_pair(cert_file: str, key_file: str) -> tuple[tuple[bytes, bytes], x509.Certificate]:
    """The PEM bytes of both files, checked to make a working server context, and the parsed
    certificate; ValueError names what is wrong."""
    pems = []
    for role, name in (("certificate", cert_file), ("private key", key_file)):
        try:
            pems.append(Path(name).read_bytes())
        except OSError as exc:
            raise ValueError(f"TLS {role} file {name!r} cannot be read ({exc.strerror}): "
                             "point the setting at a readable PEM file") from None
    _load(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), cert_file, key_file)
    certificate = x509.load_pem_x509_certificate(pems[0])
    return (pems[0], pems[1]), certificate


def _load(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        context.load_cert_chain(cert_file, key_file, password=lambda: _encrypted(key_file))
    except ssl.SSLError as exc:
        raise ValueError(f"TLS certificate {cert_file!r} with private key {key_file!r} cannot be "
                         f"used ({exc.reason or exc}): both must be PEM, the certificate first in its "
                         "chain, and the key must belong to the certificate") from None
    except OSError as exc:
        raise ValueError(f"TLS certificate {cert_file!r} or key {key_file!r} cannot be read "
                         f"({exc.strerror or exc}): point the settings at readable PEM files") \
            from None


def _encrypted(key_file: str) -> bytes:
    raise ValueError(f"TLS private key {key_file!r} is encrypted: give the server an unencrypted "
                     "PEM key (e.g. `openssl pkey -in KEY -out PLAIN`) readable only by its user")
