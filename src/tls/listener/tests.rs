//! The listener's certificate: issued for the loopback names, loaded from files, and
//! reloaded only when a changed file is good.

use std::path::Path;

use rustls::pki_types::CertificateDer;

use super::*;
use crate::tls::test_support::{handshake, verify};

const DAY: Duration = Duration::from_secs(86_400);

fn tls(files: Option<PemFiles>, names: &[&str]) -> Tls {
    Tls {
        listen: "127.0.0.1:0".parse().unwrap(),
        files,
        names: names.iter().map(|n| (*n).to_owned()).collect(),
    }
}

/// A new self-signed certificate for `name` and its key, written into `dir` as cert.pem
/// and key.pem; returns the files and the certificate.
fn write_pair(dir: &Path, name: &str) -> (PemFiles, CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    let files = PemFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&files.cert, made.cert.pem()).unwrap();
    std::fs::write(&files.key, made.signing_key.serialize_pem()).unwrap();
    (files, made.cert.der().clone())
}

fn ca() -> Arc<LocalCa> {
    Arc::new(LocalCa::in_memory().unwrap())
}

#[test]
fn an_issued_certificate_serves_the_loopback_names_and_the_configured_ones() {
    let ca = ca();
    let cert = ListenerCert::new(&tls(None, &["keyrelay.internal"]), ca.clone()).unwrap();
    let config = listener_config(cert.clone());
    for name in ["localhost", "127.0.0.1", "::1", "keyrelay.internal"] {
        let (leaf, alpn) = handshake(config.clone(), ca.cert_der(), name).unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]), "{name}");
        assert_eq!(leaf, cert.current().cert[0], "{name}");
    }
    assert!(handshake(config, ca.cert_der(), "elsewhere.test").is_err());
}

#[test]
fn an_issued_certificate_is_renewed_near_its_end_only() {
    let ca = ca();
    let t0 = SystemTime::now();
    let cert = ListenerCert::new_at(&tls(None, &[]), ca.clone(), t0).unwrap();
    let first = cert.current();
    assert!(!cert.refresh_at(t0 + 5 * DAY).unwrap());
    assert!(Arc::ptr_eq(&first, &cert.current()));
    let late = t0 + 6 * DAY + DAY / 2;
    assert!(cert.refresh_at(late).unwrap());
    let renewed = cert.current();
    assert!(!Arc::ptr_eq(&first, &renewed));
    verify(ca.cert_der(), &renewed.cert[0], "localhost", late + 6 * DAY).unwrap();
    // Renewed once: the next poll leaves it.
    assert!(!cert.refresh_at(late).unwrap());
}

#[test]
fn files_are_served_and_a_bad_replacement_keeps_the_old_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (files, first_der) = write_pair(dir.path(), "a.test");
    let cert = ListenerCert::new(&tls(Some(files.clone()), &[]), ca()).unwrap();
    assert_eq!(cert.current().cert[0], first_der);
    // Unchanged files: nothing to do.
    assert!(!cert.refresh().unwrap());

    // A truncated certificate: refused with its path, the old one kept, reported once.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
    let e = cert.refresh().unwrap_err();
    assert!(
        e.to_string().starts_with(&files.cert.display().to_string()),
        "{e}"
    );
    assert_eq!(cert.current().cert[0], first_der);
    assert!(!cert.refresh().unwrap(), "the same bad file reported again");

    // A certificate with someone else's key: refused, naming the key file.
    let other = tempfile::tempdir().unwrap();
    let (other_files, _) = write_pair(other.path(), "b.test");
    std::fs::copy(&other_files.cert, &files.cert).unwrap();
    let e = cert.refresh().unwrap_err();
    assert!(e.to_string().contains("not the private key"), "{e}");
    assert_eq!(cert.current().cert[0], first_der);

    // A good new pair: taken.
    std::fs::copy(&other_files.key, &files.key).unwrap();
    assert!(cert.refresh().unwrap());
    let now = cert.current();
    assert_ne!(now.cert[0], first_der);
    assert_eq!(
        now.cert[0],
        crate::tls::files::certs(&files.cert, &std::fs::read(&files.cert).unwrap()).unwrap()[0]
    );
}

#[test]
fn a_missing_file_keeps_the_old_certificate_until_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let (files, first_der) = write_pair(dir.path(), "a.test");
    let cert = ListenerCert::new(&tls(Some(files.clone()), &[]), ca()).unwrap();
    let saved = std::fs::read(&files.key).unwrap();
    std::fs::remove_file(&files.key).unwrap();
    let e = cert.refresh().unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
    assert_eq!(cert.current().cert[0], first_der);
    std::fs::write(&files.key, saved).unwrap();
    assert!(cert.refresh().unwrap(), "the file's return is a change");
    assert_eq!(cert.current().cert[0], first_der);
}

#[test]
fn bad_files_at_start_are_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = write_pair(dir.path(), "a.test");
    std::fs::write(&files.key, "garbage").unwrap();
    let e = ListenerCert::new(&tls(Some(files.clone()), &[]), ca()).unwrap_err();
    assert!(
        e.to_string().starts_with(&files.key.display().to_string()),
        "{e}"
    );
    let debug = format!("{:?}", ListenerCert::new(&tls(None, &[]), ca()).unwrap());
    assert!(!debug.contains("PRIVATE"), "{debug}");
}
