"""certs/ca.py: a new state dir gets an EC P-256 CA (and so EC leaves); an existing RSA CA is
used as it is (issue 19)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mitmproxy import certs

from certs import ca

FILES = ("ca.pem", "ca-cert.pem", "ca-cert.cer", "ca-cert.p12", "ca.p12", "dhparam.pem")


def _store(state_dir: Path) -> certs.CertStore:
    return certs.CertStore.from_store(ca.ca_dir(state_dir), ca.BASENAME, ca.KEY_SIZE)


def _leaf(store: certs.CertStore) -> x509.Certificate:
    return store.get_cert("api.test", [x509.DNSName("api.test")]).cert.to_cryptography()


def test_a_new_state_dir_gets_an_ec_p256_ca_and_ec_leaves(tmp_path: Path) -> None:
    cert_path = ca.ensure_ca(tmp_path)
    store = _store(tmp_path)
    key = store.default_privatekey
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    root = x509.load_pem_x509_certificate(cert_path.read_bytes())
    assert root == store.default_ca.to_cryptography()
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = root.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    leaf = _leaf(store)
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    assert leaf.signature_algorithm_oid == x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256
    leaf.verify_directly_issued_by(root)


def test_the_new_ca_files_are_mitmproxys_layout_and_private(tmp_path: Path) -> None:
    ca.ensure_ca(tmp_path)
    for name in FILES:
        mode = stat.S_IMODE((ca.ca_dir(tmp_path) / f"{ca.BASENAME}-{name}").stat().st_mode)
        assert mode & 0o077 == 0, name
    assert [p.name for p in ca.ca_dir(tmp_path).iterdir() if p.name.startswith(".")] == []


def test_ensure_ca_twice_keeps_the_first_ca(tmp_path: Path) -> None:
    first = ca.ensure_ca(tmp_path).read_bytes()
    key = (ca.ca_dir(tmp_path) / f"{ca.BASENAME}-ca.pem").read_bytes()
    ca.ensure_ca(tmp_path)
    assert ca.export_pem(tmp_path).encode() == first
    assert (ca.ca_dir(tmp_path) / f"{ca.BASENAME}-ca.pem").read_bytes() == key


@pytest.mark.parametrize("key_size", [2048, 3072])
def test_an_existing_rsa_ca_is_used_as_it_is(tmp_path: Path, key_size: int) -> None:
    """What surrogate (through mitmproxy's CertStore) wrote before issue 19: kept, byte for byte."""
    certs.CertStore.create_store(ca.ca_dir(tmp_path), ca.BASENAME, key_size)
    before = {p.name: p.read_bytes() for p in ca.ca_dir(tmp_path).iterdir()}
    ca.ensure_ca(tmp_path)
    assert {p.name: p.read_bytes() for p in ca.ca_dir(tmp_path).iterdir()} == before
    store = _store(tmp_path)
    assert isinstance(store.default_privatekey, rsa.RSAPrivateKey)
    assert store.default_privatekey.key_size == key_size
    assert isinstance(_leaf(store).public_key(), rsa.RSAPublicKey)


def test_a_broken_ca_file_raises_and_is_not_replaced(tmp_path: Path) -> None:
    ca.ca_dir(tmp_path).mkdir(parents=True)
    broken = ca.ca_dir(tmp_path) / f"{ca.BASENAME}-ca.pem"
    broken.write_bytes(b"not a key\n")
    with pytest.raises(ValueError):
        ca.ensure_ca(tmp_path)
    assert broken.read_bytes() == b"not a key\n"
