"""Throw-away PKI for the local control plane: a CA, serving and client certificates, SA keys.

The API server runs with real TLS and RBAC, so every component authenticates with its own client
certificate whose CN/O map onto the bootstrap RBAC identities (``system:kube-scheduler`` ...).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPKI:
    ca: CertPair
    apiserver: CertPair
    sa_private: Path
    sa_public: Path
    clients: dict[str, CertPair]


def _issue(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, subject: x509.Name,
           *, server_names: list[str] | None = None, client: bool = False
           ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
    b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server_names:
        alt: list[x509.GeneralName] = []
        for n in server_names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


# Client identities: file stem -> (CN, O). CNs match the bootstrap RBAC bindings.
CLIENTS = {
    "admin": ("sharetune-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kwok": ("sharetune-kwok", "system:masters"),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def generate(directory: Path, service_ip: str) -> ClusterPKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    ca_cert = (x509.CertificateBuilder().subject_name(_name("sharetune-local-ca"))
               .issuer_name(_name("sharetune-local-ca")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    ca = CertPair(directory / "ca.crt", directory / "ca.key")
    _write_cert(ca.cert, ca_cert)
    _write_key(ca.key, ca_key)

    names = ["127.0.0.1", "localhost", service_ip, "kubernetes", "kubernetes.default",
             "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    k, c = _issue(ca_key, ca_cert, _name("kube-apiserver"), server_names=names)
    api = CertPair(directory / "apiserver.crt", directory / "apiserver.key")
    _write_cert(api.cert, c)
    _write_key(api.key, k)

    clients: dict[str, CertPair] = {}
    for stem, (cn, org) in CLIENTS.items():
        k, c = _issue(ca_key, ca_cert, _name(cn, org), client=True)
        pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
        _write_cert(pair.cert, c)
        _write_key(pair.key, k)
        clients[stem] = pair

    # Service-account token signing key (RSA: what every Kubernetes version accepts).
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private, sa_public = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_private, sa_key)
    sa_public.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return ClusterPKI(ca=ca, apiserver=api, sa_private=sa_private, sa_public=sa_public, clients=clients)
