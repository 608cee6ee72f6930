"""The proxy's CA, kept in ``<state dir>/ca`` (created under a 0o077 umask, key file 0600),
and the bundle of roots used to verify upstreams.

A new CA has an EC P-256 key (issue 19), generated with ``cryptography`` and written in
mitmproxy's file layout (``mitmproxy-ca.pem`` holds key and certificate, ``mitmproxy-ca-cert.pem``
the certificate the sandbox must trust, plus the ``.cer``/``.p12`` copies and the dhparam file
mitmproxy's ``CertStore.create_store`` writes), with the extensions of mitmproxy's own
``certs.create_ca``. mitmproxy's CertStore signs every leaf certificate with the CA key and puts
the CA's *public key* in the leaf (``certs.dummy_cert``: one key for CA and every leaf), so an EC
CA makes every leaf key EC too: a P-256 signature per handshake instead of an RSA-2048 one.

An existing CA in a state dir (an RSA one made by an older surrogate, or one an operator put
there) is used as it is: the sandboxes already trust it, and replacing it would break them.
Decision: there is no automatic migration; an operator who wants EC deletes ``<state dir>/ca``
and redistributes the new certificate.

The sandbox's bundle comes in two forms: PEM (system roots + the CA, for OpenSSL, Python, Node,
git, Go, gRPC, Deno, Cargo) and PKCS#12 (the same certificates as trusted-certificate entries,
for the JVM's ``javax.net.ssl.trustStore``). The PKCS#12 file is written by ``cryptography``'s
``serialize_java_truststore`` (each certificate carries the Java trusted-key-usage attribute, so
``keytool`` lists it as a ``trustedCertEntry``), unencrypted, its MAC under the empty password:
it holds only public certificates. The JVM loads it with no ``trustStorePassword`` (it then skips
the MAC) or an empty one; ``keytool -list`` with ``-storepass ''`` or none.
"""

from __future__ import annotations

import datetime
import os
import warnings
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from mitmproxy import certs

BASENAME = "mitmproxy"  # mitmproxy's tlsconfig looks for <confdir>/mitmproxy-ca.pem
KEY_SIZE = 2048  # mitmproxy's key_size option: used only by its own create_store, never here
CURVE = ec.SECP256R1()
SYSTEM_ROOTS = Path("/etc/ssl/certs/ca-certificates.crt")


def ca_dir(state_dir: Path) -> Path:
    return state_dir / "ca"


def ca_cert_path(state_dir: Path) -> Path:
    return ca_dir(state_dir) / f"{BASENAME}-ca-cert.pem"


def ensure_ca(state_dir: Path) -> Path:
    """Create an EC CA if there is none; return the path of its certificate (PEM).

    An existing ``mitmproxy-ca.pem`` is only loaded (by mitmproxy's CertStore, whatever its key
    type), so a broken one raises here, before any listener opens."""
    old = os.umask(0o077)
    try:
        ca_dir(state_dir).mkdir(parents=True, exist_ok=True)
        if not (ca_dir(state_dir) / f"{BASENAME}-ca.pem").exists():
            _create_ec_store(ca_dir(state_dir))
        certs.CertStore.from_store(ca_dir(state_dir), BASENAME, KEY_SIZE)
    finally:
        os.umask(old)
    return ca_cert_path(state_dir)


def _create_ca(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    """mitmproxy's ``certs.create_ca``, for an EC key."""
    now = datetime.datetime.now()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, BASENAME),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, BASENAME),
        ]
    )
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .serial_number(x509.random_serial_number())
        .subject_name(name)
        .issuer_name(name)
        .not_valid_before(now + certs.CERT_VALIDITY_OFFSET)
        .not_valid_after(now + certs.CERT_VALIDITY_OFFSET + certs.CA_EXPIRY)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return builder.sign(private_key=key, algorithm=hashes.SHA256())


def _create_ec_store(path: Path) -> None:
    """The files mitmproxy's ``CertStore.create_store`` writes, for a new EC CA (umask 0o077 is
    the caller's). The key file is written last, under a temporary name and renamed: its presence
    is what says a CA exists."""
    key = ec.generate_private_key(CURVE)
    cert = _create_ca(key)
    none = serialization.NoEncryption()
    pem_cert = cert.public_bytes(serialization.Encoding.PEM)
    (path / f"{BASENAME}-ca-cert.pem").write_bytes(pem_cert)
    (path / f"{BASENAME}-ca-cert.cer").write_bytes(pem_cert)  # Android's name for it
    (path / f"{BASENAME}-ca-cert.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(BASENAME.encode(), None, cert, None, none)
    )
    (path / f"{BASENAME}-ca.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(BASENAME.encode(), key, cert, None, none)
    )
    (path / f"{BASENAME}-dhparam.pem").write_bytes(certs.DEFAULT_DHPARAM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, none)
    tmp = path / f".{BASENAME}-ca.pem.{os.getpid()}"
    tmp.write_bytes(key_pem + pem_cert)
    os.replace(tmp, path / f"{BASENAME}-ca.pem")


def export_pem(state_dir: Path) -> str:
    """The CA certificate as PEM text; raises FileNotFoundError when no CA was created yet."""
    return ca_cert_path(state_dir).read_text(encoding="ascii")


BUNDLE_FORMATS = ("pem", "pkcs12")


def sandbox_bundle_path(state_dir: Path, fmt: str = "pem") -> Path:
    """Where :func:`write_sandbox_bundle` writes by default: what the banner and ``env`` name
    (``bundle.pem``; ``bundle.p12`` for ``pkcs12``)."""
    return ca_dir(state_dir) / ("bundle.p12" if fmt == "pkcs12" else "bundle.pem")


def write_sandbox_bundle(state_dir: Path, out: Path | None, fmt: str = "pem") -> Path:
    """System roots plus surrogate's CA in one file (default :func:`sandbox_bundle_path`), for
    runtimes that read a single bundle; returns its path. ``fmt`` ``pem`` (Python, Node, git,
    Go, gRPC, Deno, Cargo) or ``pkcs12`` (a trust store for the JVM, :func:`java_trust_store`).

    The CA alone is not enough: an ``intercept: false`` host shows the client its own
    certificate, which only the system roots verify. Never creates a CA: raises
    FileNotFoundError when the state dir has none (a new one would be a CA the proxy does not
    sign with); ValueError for a format not in :data:`BUNDLE_FORMATS`."""
    if fmt not in BUNDLE_FORMATS:
        raise ValueError(f"unknown bundle format {fmt!r}; use one of {', '.join(BUNDLE_FORMATS)}")
    system = SYSTEM_ROOTS if SYSTEM_ROOTS.exists() else Path(certifi.where())
    text = system.read_text(encoding="ascii") + "\n" + export_pem(state_dir)
    data = text.encode("ascii") if fmt == "pem" else java_trust_store(text.encode("ascii"))
    if out is not None:  # the caller's file (or /dev/stdout): written in place
        out.write_bytes(data)
        if out.is_file():
            out.chmod(0o644)  # public certificates: the sandbox must be able to read it
        return out
    # The state dir's own bundle is written aside and renamed: `run` rewrites it at every start
    # while a sandbox (or `surrogate env`) may be reading it.
    out = sandbox_bundle_path(state_dir, fmt)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    os.replace(tmp, out)
    return out


def java_trust_store(pem: bytes) -> bytes:
    """Every certificate of the PEM text ``pem`` as a password-less PKCS#12 trust store (RFC
    7292), one trusted-certificate entry each; the alias is ``surrogate-ca`` for the last
    certificate (the bundle ends with surrogate's CA) and ``root-N`` for the others. Raises
    ValueError when ``pem`` holds no certificate."""
    with warnings.catch_warnings():
        # Debian's roots hold one certificate with a negative serial number (RFC 5280 forbids it;
        # the JVM's own cacerts has it too): trusted by the system, so kept, without the warning.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        found = x509.load_pem_x509_certificates(pem)
    entries = [
        pkcs12.PKCS12Certificate(cert, b"surrogate-ca" if i == len(found) - 1 else f"root-{i}".encode())
        for i, cert in enumerate(found)
    ]
    return pkcs12.serialize_java_truststore(entries, serialization.NoEncryption())


def write_upstream_bundle(state_dir: Path, extra: list[Path]) -> Path:
    """Write the system roots (Debian's bundle, else certifi's) plus ``extra`` PEM files into
    ``<state dir>/upstream-trust.pem`` and return its path.

    Raises OSError naming an unreadable extra file, ValueError for one holding no certificate.
    """
    system = SYSTEM_ROOTS if SYSTEM_ROOTS.exists() else Path(certifi.where())
    parts = [system.read_text(encoding="ascii")]
    for pem in extra:
        text = pem.read_text(encoding="ascii")
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ValueError(f"{pem}: no PEM certificate found (expected '-----BEGIN CERTIFICATE-----')")
        parts.append(text)
    out = state_dir / "upstream-trust.pem"
    # Written aside and renamed: with --workers N, every worker writes it while others read it.
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text("\n".join(parts), encoding="ascii")
    os.replace(tmp, out)
    return out
