"""TLS for every listener: the ``[tls]`` settings and the one live certificate and client CA.

`ServerTls` loads the certificate, key and client CA, hands every TLS listener its
`ssl.SSLContext` (MQTT TLS and WSS, AMQP TLS, the admin HTTPS port, a cluster's replication
port) and, on ``reload``, reads the files again into fresh contexts that every listener's
handshakes switch to from then on; connections open before go on with what they negotiated.
The gRPC listener reads ``chain()`` instead (grpc takes PEM bytes, not contexts); a node
connecting to another takes ``peer()`` for each connection. A verified client certificate names
its user by its subject's common name (``certificate_user``). Loading blocks on file reads: run
it at start or on SIGHUP.
"""

from __future__ import annotations

import datetime
import functools
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
    and native gRPC. SIGHUP reloads ``cert``, ``key`` and ``client_ca`` without dropping
    connections."""

    cert: str | None = None
    """PEM certificate chain (server certificate first) served by every TLS listener; with
    ``key`` it opens the MQTT TLS/WSS and AMQP TLS listeners and turns on HTTPS for the admin
    port and TLS for the native port (``admin.tls``, ``native.tls``)."""
    key: str | None = None
    """PEM private key of ``cert``, unencrypted, readable only by the broker's user."""
    client_ca: str | None = None
    """PEM file of the CA certificates that client certificates must be signed by; needed when
    ``client_certs`` is not "none". SIGHUP reloads it for new handshakes."""
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


Kind = Literal["server", "verifying", "peer"]
"""What a context is for: a listener that asks for no client certificate, one that verifies
them against ``client_ca``, or a client connecting to another node (``peer_context``)."""


class ServerTls:
    """The certificate and client CA of every TLS listener, reloadable. Thread-safe.

    Each listener keeps the context it was given, but that context only starts handshakes: its
    ``sni_callback`` (called for every ClientHello, with or without a server name) switches the
    handshake to the context of its kind that ``reload`` built last. A fresh context, not files
    loaded into an old one, so that a CA removed from ``client_ca`` stops being trusted."""

    def __init__(self, config: TlsConfig) -> None:
        """Load ``config``'s files; ValueError names the file and what is wrong with it."""
        assert config.cert and config.key, "ServerTls needs tls.cert and tls.key"
        self.config = config
        self._lock = threading.Lock()
        self._current: dict[Kind, ssl.SSLContext] = {}
        self._chain, self.certificate = _read_pair(config.cert, config.key)
        self.generation = 0
        """Grows by one at each successful reload."""

    def context(self, *, client_certs: bool = False) -> ssl.SSLContext:
        """A listener's TLS 1.2+ server context: every handshake on it gets the certificate (and
        client CA) last loaded; ``client_certs``: ask for client certificates as
        ``tls.client_certs`` says. ValueError when ``client_ca`` cannot be used."""
        kind: Kind = "verifying" if client_certs and self.config.verifies_clients else "server"
        self._context(kind)
        listener = self._build(kind)
        listener.sni_callback = functools.partial(self._switch, kind)
        return listener

    def peer(self) -> ssl.SSLContext:
        """The client context for connecting to another node (``peer_context``) as last loaded;
        take it again for each connection. ValueError when its CA file cannot be used."""
        return self._context("peer")

    def chain(self) -> tuple[bytes, bytes, int]:
        """(certificate chain PEM, key PEM, generation) as last loaded."""
        with self._lock:
            return self._chain[0], self._chain[1], self.generation

    def reload(self) -> str:
        """Read the certificate, key and client CA files again for new handshakes; connections
        open before go on with what they negotiated.

        Returns a line saying what is served and trusted now; ValueError (everything stays as it
        was) when a file cannot be used. Blocks on file reads."""
        config = self.config
        with self._lock:
            chain, certificate = _read_pair(config.cert, config.key)  # type: ignore[arg-type]
            current = {kind: self._build(kind) for kind in self._current}
            self._current = current
            self._chain, self.certificate = chain, certificate
            self.generation += 1
        served = describe(certificate)
        verifying = current.get("verifying") or (config.client_ca and current.get("peer"))
        if verifying is not None:
            served += (f"; trusting the {len(verifying.get_ca_certs())} CA certificate(s) of "
                       f"tls.client_ca {config.client_ca}")
        return served

    def _context(self, kind: Kind) -> ssl.SSLContext:
        with self._lock:
            if kind not in self._current:
                self._current[kind] = self._build(kind)
            return self._current[kind]

    def _switch(self, kind: Kind, ssl_object: ssl.SSLObject | ssl.SSLSocket,
                _server_name: str | None, _listener: ssl.SSLContext) -> None:
        ssl_object.context = self._current[kind]

    def _build(self, kind: Kind) -> ssl.SSLContext:
        config = self.config
        if kind == "peer":
            return peer_context(config)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if kind == "verifying":
            assert config.client_ca is not None
            try:
                context.load_verify_locations(cafile=config.client_ca)
            except (OSError, ssl.SSLError) as error:
                raise _bad_ca("tls.client_ca", config.client_ca, error) from None
            context.verify_mode = (ssl.CERT_REQUIRED if config.client_certs == "required"
                                   else ssl.CERT_OPTIONAL)
        _load(context, config.cert, config.key)  # type: ignore[arg-type]
        return context


def peer_context(config: TlsConfig) -> ssl.SSLContext:
    """A client context for connecting to another node that serves ``config``'s certificate:
    it trusts ``client_ca``, else the certificate itself (no chain to a root needed), and
    checks the host name as any client does. ValueError when the file cannot be used."""
    setting, cafile = ("tls.client_ca", config.client_ca) if config.client_ca \
        else ("tls.cert", config.cert)
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as error:
        raise _bad_ca(setting, cafile, error) from None  # type: ignore[arg-type]
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def _bad_ca(setting: str, cafile: str, error: Exception) -> ValueError:
    return ValueError(f"{setting} {cafile!r} cannot be used to verify certificates ({error}): "
                      "point it at a readable PEM file of CA certificates")


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
