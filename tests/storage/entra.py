"""Entra ID on the emulator: a self-signed certificate for Azurite's HTTPS, and a managed
identity endpoint (the one App Service and Container Apps give a process through
``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER``) that issues the tokens Azurite's
``--oauth basic`` accepts, so ``DefaultAzureCredential`` itself fetches them."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from timeline.tools.azurite import HOST

TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
IDENTITY_SECRET = "test-identity-header"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for ``HOST`` that is its own CA, and its key: (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def unsigned_jwt(audience: str, issuer: str = f"https://sts.windows.net/{TENANT}/") -> str:
    """A token shaped as Entra ID issues them (Azurite's basic OAuth reads, never verifies)."""
    now = int(time.time())
    claims = {"aud": audience, "iss": issuer, "iat": now, "nbf": now - 60, "exp": now + 3600}
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."


class IdentityEndpoint:
    """The managed identity endpoint of App Service / Container Apps (api-version
    2019-08-01): issues a token for the ``resource`` asked, with ``audience`` when set."""

    def __init__(self, audience: str | None = None) -> None:
        self.audience = audience
        self.issued: list[str] = []
        """The resources tokens were issued for."""
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("X-IDENTITY-HEADER") != IDENTITY_SECRET:
            return web.json_response({"error": "bad identity header"}, status=401)
        resource = request.query["resource"]
        self.issued.append(resource)
        return web.json_response(
            {
                "access_token": unsigned_jwt(self.audience or resource),
                "expires_on": str(int(time.time()) + 3600),
                "resource": resource,
                "token_type": "Bearer",
            }
        )

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[IdentityEndpoint]:
        app = web.Application()
        app.router.add_get("/msi/token", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://{HOST}:{port}/msi/token"
        try:
            yield self
        finally:
            await runner.cleanup()
