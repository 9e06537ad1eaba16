"""`sluice dev-cert`: the files it writes (a CA signing a server and a client certificate, keys
readable by their owner only), what it prints, and its refusals."""
from __future__ import annotations

import ipaddress
import os
import stat

from cryptography import x509
from cryptography.x509.oid import NameOID

from sluice.cli import main


def test_dev_cert_writes_a_ca_a_server_and_a_client_certificate_and_prints_the_flags(
        tmp_path, capsys):
    folder = tmp_path / "certs"
    assert main(["dev-cert", "--dir", str(folder), "--host", "broker.test", "10.0.0.7",
                 "--days", "3", "--client", "alice"]) == 0
    out = capsys.readouterr().out
    assert f"--tls-cert {folder / 'server.pem'} --tls-key {folder / 'server-key.pem'}" in out
    assert f"SLUICE_CA={folder / 'ca.pem'}" in out and "curl --cacert" in out
    for key in ("ca-key.pem", "server-key.pem", "client-key.pem"):
        assert stat.S_IMODE(os.stat(folder / key).st_mode) == 0o600, key
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((folder / "server.pem").read_bytes())
    client = x509.load_pem_x509_certificate((folder / "client.pem").read_bytes())
    for issued in (server, client):
        issued.verify_directly_issued_by(ca)
        assert (issued.not_valid_after_utc - issued.not_valid_before_utc).days == 3
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "broker.test"} <= set(names.get_values_for_type(x509.DNSName))
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.0.0.7")} <= \
        set(names.get_values_for_type(x509.IPAddress))
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"


def test_dev_cert_does_not_overwrite_without_force(tmp_path, capsys):
    folder = str(tmp_path / "certs")
    assert main(["dev-cert", "--dir", folder]) == 0
    before = (tmp_path / "certs" / "ca.pem").read_bytes()
    assert main(["dev-cert", "--dir", folder]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (tmp_path / "certs" / "ca.pem").read_bytes() == before
    assert main(["dev-cert", "--dir", folder, "--force"]) == 0
    assert (tmp_path / "certs" / "ca.pem").read_bytes() != before
    assert main(["dev-cert", "--dir", folder, "--force", "--days", "0"]) == 2
