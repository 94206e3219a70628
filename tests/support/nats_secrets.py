"""Test credentials for NATS, made on the spot: TLS certificates (a CA, a server and a client
certificate, with ``cryptography``), user nkeys, and operator-mode JWTs with a user's .creds file
(signed with ``nkeys`` as nsc would)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    folder.mkdir(parents=True, exist_ok=True)
    pem = Pem(folder / f"{stem}.pem", folder / f"{stem}-key.pem")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pem


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates into ``folder``."""

    def __init__(self, folder: Path, name: str = "embedfleet test CA") -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = _write(folder, "ca", self._cert, self._key)

    def issue(self, stem: str, names: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return _write(self.folder, stem, cert, key)

    def server(self, dns_name: str) -> Pem:
        """A server certificate for ``dns_name`` only (clients connecting by IP name it with tls_hostname)."""
        return self.issue("server", [x509.DNSName(dns_name)], ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, email: str) -> Pem:
        """A client certificate whose e-mail SAN nats-server's verify_and_map maps to a user."""
        return self.issue(f"client-{email.split('@')[0]}", [x509.RFC822Name(email)], ExtendedKeyUsageOID.CLIENT_AUTH)


def new_seed(prefix: int) -> str:
    """A fresh nkey seed (``nkeys.PREFIX_BYTE_USER`` -> SU..., ``_ACCOUNT`` -> SA..., ``_OPERATOR`` -> SO...)."""
    return nkeys.encode_seed(os.urandom(32), prefix).decode()


def public_key(seed: str) -> str:
    return nkeys.from_seed(bytearray(seed.encode())).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(issuer_seed: str, subject: str, name: str, nats: dict) -> str:
    """A NATS JWT (header alg ed25519-nkey) for ``subject``, signed by ``issuer_seed``."""
    claims = {"iat": int(time.time()), "iss": public_key(issuer_seed), "name": name, "sub": subject, "nats": nats}
    claims["jti"] = (
        base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode().rstrip("=")
    )
    signing_input = (
        f"{_b64(json.dumps({'typ': 'JWT', 'alg': 'ed25519-nkey'}).encode())}.{_b64(json.dumps(claims).encode())}"
    )
    signature = nkeys.from_seed(bytearray(issuer_seed.encode())).sign(signing_input.encode())
    return f"{signing_input}.{_b64(signature)}"


_UNLIMITED = {"subs": -1, "data": -1, "payload": -1}
_ACCOUNT_LIMITS = {
    **_UNLIMITED,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}  # JetStream on


class Operator:
    """An operator with a system account and one account for the fleet, as nats-server's operator
    mode wants them: ``server_config()`` trusts the operator and preloads both accounts;
    ``creds(path)`` writes a new user's .creds file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.operator_seed = new_seed(nkeys.PREFIX_BYTE_OPERATOR)
        self.account_seed = new_seed(nkeys.PREFIX_BYTE_ACCOUNT)
        self.system_seed = new_seed(nkeys.PREFIX_BYTE_ACCOUNT)
        operator = public_key(self.operator_seed)
        self.operator_jwt = _jwt(self.operator_seed, operator, "embedfleet-test", {"type": "operator", "version": 2})
        self.accounts = {
            public_key(seed): _jwt(
                self.operator_seed, public_key(seed), name, {"type": "account", "version": 2, "limits": limits}
            )
            for seed, name, limits in (
                (self.account_seed, "fleet", _ACCOUNT_LIMITS),
                (self.system_seed, "SYS", {**_ACCOUNT_LIMITS, "mem_storage": 0, "disk_storage": 0}),
            )
        }

    def server_config(self) -> str:
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "operator.jwt").write_text(self.operator_jwt)
        preload = "".join(f'  {account}: "{jwt}"\n' for account, jwt in self.accounts.items())
        return (
            f'operator: "{folder / "operator.jwt"}"\n'
            f"system_account: {public_key(self.system_seed)}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}}}\n"
        )

    def creds(self, path: Path, account_seed: str | None = None) -> str:
        """Write a new user's credentials file (signed by this account, or by ``account_seed``); its seed."""
        user_seed = new_seed(nkeys.PREFIX_BYTE_USER)
        user_jwt = _jwt(
            account_seed or self.account_seed,
            public_key(user_seed),
            "service",
            {"type": "user", "version": 2, "pub": {}, "sub": {}, **_UNLIMITED},
        )
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{user_jwt}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{user_seed}\n"
            "------END USER NKEY SEED------\n"
        )
        return user_seed
