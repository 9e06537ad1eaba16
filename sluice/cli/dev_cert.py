"""`sluice dev-cert`: a private CA, a server certificate and a client certificate for trying TLS.

The CA signs both; the server certificate names localhost, 127.0.0.1, ::1 and any ``--host``;
the client certificate's CN is a Sluice user name (``--client``), which is who it logs in as
when the broker takes client certificates. Keys are EC P-256, written with mode 0600. For
development and tests: a production broker gets its certificate from the organisation's CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
FILES = ("ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")


@dataclass(frozen=True)
class DevCerts:
    """Paths of what `write_dev_certs` wrote."""

    ca: str
    ca_key: str
    cert: str
    key: str
    client_cert: str
    client_key: str


def write_dev_certs(folder: str | Path, hosts: tuple[str, ...] = (), days: int = 365,
                    client: str = "sluice", not_before: datetime.datetime | None = None,
                    overwrite: bool = False) -> DevCerts:
    """Write a CA, a server certificate for ``DEFAULT_HOSTS`` + ``hosts`` and a client
    certificate with CN ``client`` into ``folder``, each valid ``days`` days from
    ``not_before`` (default: five minutes ago). FileExistsError if a file is there already,
    unless ``overwrite``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = DevCerts(*(str(folder / name) for name in FILES))
    if not overwrite:
        for path in vars(paths).values():
            if os.path.exists(path):
                raise FileExistsError(path)
    start = not_before or datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Sluice development CA")])
    ca = (_builder(ca_name, ca_name, ca_key.public_key(), start, end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(paths.ca, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(paths.ca_key, _key_pem(ca_key), 0o600)
    names = list(dict.fromkeys(DEFAULT_HOSTS + tuple(hosts)))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (_builder(_name(names[0]), ca_name, server_key.public_key(), start, end)
              .add_extension(x509.SubjectAlternativeName([_san(name) for name in names]), False)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
              .sign(ca_key, hashes.SHA256()))
    _write(paths.cert, server.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(paths.key, _key_pem(server_key), 0o600)
    client_key = ec.generate_private_key(ec.SECP256R1())
    user = (_builder(_name(client), ca_name, client_key.public_key(), start, end)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256()))
    _write(paths.client_cert, user.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(paths.client_key, _key_pem(client_key), 0o600)
    return paths


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey,
             start: datetime.datetime, end: datetime.datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a file created with ``mode`` (a key is never readable by others, not
    even for a moment)."""
    if os.path.exists(path):
        os.unlink(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)  # whatever the umask took away from a certificate's read bits


def _run(args: argparse.Namespace) -> int:
    if args.days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    try:
        paths = write_dev_certs(args.dir, tuple(args.host), args.days, args.client,
                                overwrite=args.force)
    except FileExistsError as error:
        print(f"error: {error} exists already; pass --force to replace the files in {args.dir}, "
              "or another --dir", file=sys.stderr)
        return 2
    print(usage(paths, args.client))
    return 0


def usage(paths: DevCerts, client: str) -> str:
    """What to do with the files: the `sluice serve` flags and each client's options."""
    q = shlex.quote
    return "\n".join([
        f"Wrote a development CA, a server certificate and a client certificate for user {client!r}:",
        *(f"  {path}" for path in vars(paths).values()),
        "",
        "Serve TLS on every listener (client certificates optional):",
        f"  sluice serve --tls-cert {q(paths.cert)} --tls-key {q(paths.key)} "
        f"--tls-client-ca {q(paths.ca)} --tls-client-certs optional",
        "or in the environment:",
        f"  SLUICE_TLS_CERT={q(paths.cert)} SLUICE_TLS_KEY={q(paths.key)} "
        f"SLUICE_TLS_CLIENT_CA={q(paths.ca)} SLUICE_TLS_CLIENT_CERTS=optional",
        "",
        "Clients trust the CA:",
        f"  export SLUICE_CA={q(paths.ca)}   # sluice ... --admin https://127.0.0.1:8080, sluice send/consume",
        f"  curl --cacert {q(paths.ca)} https://127.0.0.1:8080/health",
        f"  mosquitto_pub --cafile {q(paths.ca)} -h 127.0.0.1 -p 8883 -t t -m hi -u sluice -P sluice",
        f"  mosquitto_pub --cafile {q(paths.ca)} --cert {q(paths.client_cert)} "
        f"--key {q(paths.client_key)} -h 127.0.0.1 -p 8883 -t t -m hi   # as {client!r}",
    ])


def add_dev_cert_command(commands: argparse._SubParsersAction) -> None:
    """Register `dev-cert` under ``commands``."""
    text = ("Write a development CA (ca.pem), a server certificate (server.pem, server-key.pem) "
            "for localhost, 127.0.0.1, ::1 and each --host, and a client certificate "
            "(client.pem, client-key.pem) whose CN is the user --client, then print the "
            "`sluice serve` flags and client options that use them. Keys are written with mode "
            "0600. For development and tests only.")
    sub = commands.add_parser("dev-cert", help="Make a CA and TLS certificates for development.",
                              description=text)
    sub.add_argument("--dir", default="./certs", metavar="DIR",
                     help="where to write the files (default: ./certs)")
    sub.add_argument("--host", nargs="+", default=[], metavar="NAME",
                     help="more host names or addresses the server certificate is for")
    sub.add_argument("--days", type=int, default=365, metavar="N",
                     help="validity in days (default: 365)")
    sub.add_argument("--client", default="sluice", metavar="USER",
                     help="the user the client certificate logs in as, its CN (default: sluice)")
    sub.add_argument("--force", action="store_true", help="replace files that exist")
    sub.set_defaults(handler=_run)
