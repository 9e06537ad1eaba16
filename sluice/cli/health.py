"""`sluice health`: ask a broker's admin API for ``/health``; exit 0 when it says ok, 1 otherwise.

Made for container health checks, which run beside the broker with the broker's environment.
The URL is ``--admin``, else ``SLUICE_ADMIN_URL``, else ``http://127.0.0.1:8080``. When that
environment gives the broker a certificate (``SLUICE_TLS_CERT`` or the config file's
``tls.cert``) and ``admin.tls`` is on, the admin port speaks HTTPS only, so an ``http://`` URL is
asked over HTTPS. An https URL is verified against ``--ca``/``SLUICE_CA``; without one, a loopback
URL is verified against the broker's own certificate file (the broker this container runs, its
certificate possibly self-signed), any other against the system's trusted CAs.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request

from .admin import DEFAULT_ADMIN_URL

TIMEOUT_S = 4.0
"""Less than the image's HEALTHCHECK timeout (5 s), so the check says why it failed."""


class Unhealthy(Exception):
    """The check failed; the message says why and what to look at."""


def _configured_cert(env: dict[str, str]) -> str | None:
    """The broker's certificate file when its admin port serves HTTPS, from ``env`` (and the
    config file ``SLUICE_CONFIG`` names); None when the admin port speaks plain HTTP."""
    from ..server.config import ConfigError, load_config

    try:
        config = load_config(env.get("SLUICE_CONFIG"), env)
    except ConfigError as error:
        raise Unhealthy(f"the broker's settings are invalid ({error})") from None
    return config.tls.cert if config.tls.cert and config.admin.tls else None


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pinned(cert_file: str) -> ssl.SSLContext:
    """A context that accepts exactly the first certificate of ``cert_file``: the broker's own.
    The host name is not checked: the certificate names the broker's public names, seldom
    127.0.0.1, and no other certificate is trusted."""
    try:
        with open(cert_file, encoding="ascii") as pem:
            text = pem.read()
    except (OSError, UnicodeDecodeError) as error:
        raise Unhealthy(f"cannot read the broker's certificate {cert_file} ({error}); "
                        "pass --ca FILE naming the CA that signed it") from None
    end = "-----END CERTIFICATE-----"
    leaf = text[:text.find(end) + len(end)] if end in text else ""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    try:
        context.load_verify_locations(cadata=leaf)
    except ssl.SSLError as error:
        raise Unhealthy(f"{cert_file} holds no PEM certificate ({error}); "
                        "pass --ca FILE naming the CA that signed it") from None
    return context


def _context(url: str, ca: str | None, own_cert: str | None) -> ssl.SSLContext | None:
    if not url.startswith("https:"):
        return None
    if ca:
        try:
            return ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as error:
            raise Unhealthy(f"--ca {ca}: cannot read it as PEM CA certificates ({error})") from None
    if own_cert and _loopback(url):
        return _pinned(own_cert)
    return ssl.create_default_context()


def check(url: str, ca: str | None, env: dict[str, str], timeout: float = TIMEOUT_S) -> str:
    """Ask ``url``'s ``/health``; its status line when ok, else Unhealthy saying why."""
    own_cert = _configured_cert(env)
    if own_cert and url.startswith("http:"):
        url = "https:" + url[len("http:"):]
    target = url.rstrip("/") + "/health"
    context = _context(url, ca, own_cert)
    try:
        with urllib.request.urlopen(target, timeout=timeout, context=context) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:  # 503: failing or degraded, with what is wrong
        raw = error.read()
    except urllib.error.URLError as error:
        if isinstance(error.reason, ssl.SSLCertVerificationError):
            raise Unhealthy(f"{target}: certificate not trusted ({error.reason.verify_message}); "
                            "pass --ca FILE (or SLUICE_CA) naming the CA that signed it") from None
        raise Unhealthy(f"{target}: unreachable ({error.reason}); is `sluice serve` running?") from None
    except (OSError, ValueError) as error:
        raise Unhealthy(f"{target}: no answer ({error}); is `sluice serve` running, and is "
                        "the URL's scheme (http or https) the one the admin port speaks?") from None
    try:
        report = json.loads(raw)
        status = report["status"]
    except (ValueError, KeyError, TypeError):
        raise Unhealthy(f"{target}: not a Sluice health report: {raw[:200]!r}") from None
    if status != "ok":
        problems = {name: part for name, part in report.items()
                    if isinstance(part, dict) and part.get("status") not in (None, "ok")}
        raise Unhealthy(f"{target}: {status} {json.dumps(problems, sort_keys=True)}")
    return f"{target}: ok"


def _run(args: argparse.Namespace) -> int:
    try:
        print(check(args.admin, args.ca, dict(os.environ), args.timeout))
    except Unhealthy as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    return 0


def add_health_command(commands: argparse._SubParsersAction) -> None:
    """Register `health` under ``commands``."""
    text = ("Ask the admin API's /health (no credentials needed) and exit 0 when the broker says "
            "ok, 1 otherwise (failing, degraded, unreachable, untrusted), saying why: the "
            "container images' health check. When this environment gives the broker a "
            "certificate (SLUICE_TLS_CERT, or tls.cert in $SLUICE_CONFIG) and admin.tls is on, "
            "an http URL is asked over HTTPS. An https URL is verified against --ca; without "
            "one, a loopback URL against the broker's own certificate file, any other against "
            "the system's trusted CAs.")
    sub = commands.add_parser("health", help="Check a broker's /health (exit 0: ok).",
                              description=text)
    sub.add_argument("--admin", metavar="URL",
                     default=os.environ.get("SLUICE_ADMIN_URL", DEFAULT_ADMIN_URL),
                     help="admin API base URL (default: $SLUICE_ADMIN_URL or %(default)s)")
    sub.add_argument("--ca", metavar="PEM", default=os.environ.get("SLUICE_CA") or None,
                     help="CA certificate(s) to verify an https admin API with (default: "
                     "$SLUICE_CA; see above without it)")
    sub.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                     help="seconds to wait for the answer (default: %(default)s)")
    sub.set_defaults(handler=_run)
