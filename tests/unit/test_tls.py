"""`ServerTls`: a real TLS handshake on 127.0.0.1, clear errors for bad files, reload in place."""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from cryptography import x509

from protocols.tls import ServerTls, TlsConfig, certificate_user
from sluice.cli.dev_cert import write_dev_certs


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    return ServerTls(TlsConfig(cert, key)).context()


def test_a_client_trusting_the_certificate_completes_a_handshake_and_gets_an_echo(cert_files):
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()

    async def main() -> tuple[bytes, str]:
        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ssl_context(*cert_files))
        port = server.sockets[0].getsockname()[1]
        client_context = ssl.create_default_context(cafile=cert_files.cert)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
            writer.write(b"hello")
            answer = await asyncio.wait_for(reader.readexactly(5), 5)
            version = writer.get_extra_info("ssl_object").version()
            writer.close()
            await writer.wait_closed()
        return answer, version

    answer, version = asyncio.run(main())
    assert answer == b"hello"
    assert version in ("TLSv1.2", "TLSv1.3")


def test_the_context_refuses_anything_older_than_tls_1_2(cert_files):
    assert server_ssl_context(*cert_files).minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_missing_certificate_file_is_named(cert_files, tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match="certificate file.*nope.pem.*readable PEM"):
        server_ssl_context(missing, cert_files.key)


def test_a_missing_key_file_is_named(cert_files, tmp_path):
    missing = str(tmp_path / "nokey.pem")
    with pytest.raises(ValueError, match="private key file.*nokey.pem"):
        server_ssl_context(cert_files.cert, missing)


def test_a_key_of_another_certificate_is_refused(cert_files, make_cert_files):
    other = make_cert_files("other")
    with pytest.raises(ValueError, match="cert.pem.*key.pem.*belong to the certificate"):
        server_ssl_context(cert_files.cert, other.key)


def test_a_file_that_is_not_pem_is_refused(cert_files, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="garbage.pem"):
        server_ssl_context(str(garbage), cert_files.key)


def test_an_encrypted_key_is_refused_without_prompting(cert_files, tmp_path):
    key = serialization.load_pem_private_key(Path(cert_files.key).read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(ValueError, match="encrypted.pem.*is encrypted"):
        server_ssl_context(cert_files.cert, str(encrypted))


def test_reload_serves_the_new_certificate_to_new_handshakes_and_keeps_the_old_on_bad_files(
        tmp_path):
    first = write_dev_certs(tmp_path / "certs")
    tls = ServerTls(TlsConfig(first.cert, first.key))
    context = tls.context()

    def served_serial() -> int:
        async def main() -> int:
            server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0,
                                                ssl=context)
            port = server.sockets[0].getsockname()[1]
            async with server:
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=ssl.create_default_context(cafile=first.ca))
                der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                writer.close()
            return x509.load_der_x509_certificate(der).serial_number
        return asyncio.run(main())

    assert served_serial() == tls.certificate.serial_number
    old_serial = tls.certificate.serial_number
    write_dev_certs(tmp_path / "certs", overwrite=True)  # same paths, a new CA and certificate
    assert "CN=localhost" in tls.reload() and tls.generation == 1
    assert served_serial() == tls.certificate.serial_number != old_serial
    assert tls.chain()[0] == Path(first.cert).read_bytes()
    Path(first.key).write_text("not a key\n")
    with pytest.raises(ValueError, match="server-key.pem"):
        tls.reload()
    assert tls.generation == 1 and served_serial() == tls.certificate.serial_number


def test_certificate_user_is_the_cn_of_a_verified_client_certificate_only(tmp_path):
    certs = write_dev_certs(tmp_path / "certs", client="alice")
    tls = ServerTls(TlsConfig(certs.cert, certs.key, certs.ca, "optional"))
    context = tls.context(client_certs=True)

    async def user_of(client_cert: tuple[str, str] | None) -> str | None:
        seen: list[str | None] = []

        async def handle(reader, writer) -> None:
            seen.append(certificate_user(writer.get_extra_info("ssl_object")))
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cafile=certs.ca)
        if client_cert:
            client.load_cert_chain(*client_cert)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
            await reader.read()
            writer.close()
        return seen[0]

    assert asyncio.run(user_of((certs.client_cert, certs.client_key))) == "alice"
    assert asyncio.run(user_of(None)) is None
    assert certificate_user(None) is None


def test_reload_trusts_the_new_client_ca_for_new_handshakes_only_and_keeps_it_on_a_bad_file(
        tmp_path):
    server = write_dev_certs(tmp_path / "server", client="alice")
    second = write_dev_certs(tmp_path / "second", client="bob")
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(Path(server.ca).read_bytes())
    tls = ServerTls(TlsConfig(server.cert, server.key, str(client_ca), "required"))
    alice, bob = (server.client_cert, server.client_key), (second.client_cert, second.client_key)

    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
            writer.close()

        listener = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls.context(client_certs=True))
        port = listener.sockets[0].getsockname()[1]

        async def connect(cert: tuple[str, str]):
            context = ssl.create_default_context(cafile=server.ca)
            context.load_cert_chain(*cert)
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            return reader, writer

        async def accepted(cert: tuple[str, str]) -> bool:
            try:
                reader, writer = await connect(cert)
                writer.write(b"ping\n")
                answer = await asyncio.wait_for(reader.readline(), 10)
                writer.close()
            except (ssl.SSLError, ConnectionError):  # refused in the handshake (TLS 1.2)
                return False
            return answer == b"ping\n"  # TLS 1.3: refused after it, the connection ends

        async with listener:
            assert await accepted(alice) and not await accepted(bob)
            opened_reader, opened_writer = await connect(alice)
            client_ca.write_bytes(Path(second.ca).read_bytes())
            assert "1 CA certificate(s) of tls.client_ca" in await asyncio.to_thread(tls.reload)
            assert await accepted(bob)
            assert not await accepted(alice)  # the CA taken out of the file is trusted no more
            opened_writer.write(b"still open\n")
            assert await asyncio.wait_for(opened_reader.readline(), 10) == b"still open\n"
            client_ca.write_text("not a certificate\n")
            with pytest.raises(ValueError, match="client-ca.pem.*PEM file of CA certificates"):
                await asyncio.to_thread(tls.reload)
            assert await accepted(bob) and not await accepted(alice)
            opened_writer.close()

    asyncio.run(main())


def test_the_peer_context_trusts_the_reloaded_client_ca(tmp_path):
    first = write_dev_certs(tmp_path / "first")
    second = write_dev_certs(tmp_path / "second")
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(Path(first.ca).read_bytes())
    tls = ServerTls(TlsConfig(first.cert, first.key, str(client_ca)))
    client_ca.write_bytes(Path(second.ca).read_bytes())
    tls.reload()
    # as numbers: OpenSSL writes a serial in whole bytes of hex, with a leading 0 where needed
    trusted = {int(cert["serialNumber"], 16) for cert in tls.peer().get_ca_certs()}
    assert trusted == {x509.load_pem_x509_certificate(Path(second.ca).read_bytes()).serial_number}
