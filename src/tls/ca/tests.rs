//! The local CA: its files, its refusals, and the leaves it issues.

use super::*;
use crate::config::PemFiles;
use crate::tls::test_support::{handshake, verify};

fn generated(dir: &Path) -> LocalCa {
    LocalCa::load_or_create(&config::Ca::default(), Some(dir)).expect("a CA in the dir")
}

fn leaf_of(issued: &Issued) -> CertificateDer<'static> {
    issued.key.cert[0].clone()
}

#[test]
fn a_generated_ca_is_written_once_and_loaded_after() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = generated(&data);
    assert!(first.was_created());
    assert_eq!(first.cert_path(), Some(data.join("ca.pem").as_path()));
    assert_eq!(first.key_path(), Some(data.join("ca.key").as_path()));
    let on_disk = std::fs::read_to_string(data.join("ca.pem")).unwrap();
    assert_eq!(on_disk, first.cert_pem());
    assert!(first.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    let key_before = std::fs::read(data.join("ca.key")).unwrap();

    let second = generated(&data);
    assert!(!second.was_created());
    assert_eq!(second.cert_pem(), first.cert_pem());
    assert_eq!(second.cert_der(), first.cert_der());
    assert_eq!(std::fs::read(data.join("ca.key")).unwrap(), key_before);
    // The loaded CA signs leaves that verify against the certificate the first one wrote.
    let issued = second
        .issue(&["a.test".to_owned()], SystemTime::now())
        .unwrap();
    verify(
        first.cert_der(),
        &leaf_of(&issued),
        "a.test",
        SystemTime::now(),
    )
    .unwrap();
}

#[cfg(unix)]
#[test]
fn the_generated_key_is_mode_0600_and_the_cert_is_not_secret() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    let mode = |name: &str| {
        std::fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("ca.key"), 0o600);
    assert!(!files::readable_by_others(&dir.path().join("ca.key")));
    // The certificate is public: only the umask limits it.
    assert_eq!(mode("ca.pem") & 0o600, 0o600);
}

#[test]
fn half_a_pair_is_refused_naming_both_files_and_nothing_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    let cert = dir.path().join("ca.pem");
    let key = dir.path().join("ca.key");
    let cert_text = std::fs::read(&cert).unwrap();
    std::fs::remove_file(&key).unwrap();
    let e = LocalCa::load_or_create(&config::Ca::default(), Some(dir.path())).unwrap_err();
    assert!(matches!(e, TlsError::HalfPair { .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains(&cert.display().to_string()), "{message}");
    assert!(message.contains(&key.display().to_string()), "{message}");
    assert_eq!(std::fs::read(&cert).unwrap(), cert_text);
    assert!(!key.exists());

    // The other half.
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    std::fs::remove_file(dir.path().join("ca.pem")).unwrap();
    let e = LocalCa::load_or_create(&config::Ca::default(), Some(dir.path())).unwrap_err();
    assert!(matches!(e, TlsError::HalfPair { .. }), "{e:?}");
    assert!(!dir.path().join("ca.pem").exists());
}

#[test]
fn a_corrupt_file_is_refused_with_its_path_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    let cert = dir.path().join("ca.pem");
    std::fs::write(&cert, "not a certificate\n").unwrap();
    let e = LocalCa::load_or_create(&config::Ca::default(), Some(dir.path())).unwrap_err();
    let message = e.to_string();
    assert!(
        message.starts_with(&cert.display().to_string()),
        "{message}"
    );
    assert!(message.contains("no certificate"), "{message}");
    assert_eq!(
        std::fs::read_to_string(&cert).unwrap(),
        "not a certificate\n"
    );

    // A key file whose base64 is broken: named, and its bytes are not quoted.
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    let key = dir.path().join("ca.key");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nSECRETSECRET!!!\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let message = LocalCa::load_or_create(&config::Ca::default(), Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(message.starts_with(&key.display().to_string()), "{message}");
    assert!(!message.contains("SECRET"), "{message}");
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    generated(a.path());
    generated(b.path());
    let files = PemFiles {
        cert: a.path().join("ca.pem"),
        key: b.path().join("ca.key"),
    };
    let message = LocalCa::load_or_create(
        &config::Ca {
            files: Some(files.clone()),
        },
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.starts_with(&files.key.display().to_string()),
        "{message}"
    );
    assert!(message.contains("not the private key"), "{message}");
}

#[test]
fn configured_ca_files_are_used_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let made = generated(dir.path());
    let files = PemFiles {
        cert: dir.path().join("ca.pem"),
        key: dir.path().join("ca.key"),
    };
    let other = tempfile::tempdir().unwrap();
    let ca = LocalCa::load_or_create(
        &config::Ca {
            files: Some(files.clone()),
        },
        Some(other.path()),
    )
    .unwrap();
    assert_eq!(ca.cert_path(), Some(files.cert.as_path()));
    assert_eq!(ca.cert_pem(), made.cert_pem());
    assert!(!ca.was_created());
    // Nothing was generated into the data dir.
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
}

#[test]
fn a_cert_file_that_also_holds_a_key_prints_only_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    generated(dir.path());
    let key_pem = std::fs::read_to_string(dir.path().join("ca.key")).unwrap();
    let cert_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let both = dir.path().join("both.pem");
    std::fs::write(&both, format!("{key_pem}{cert_pem}")).unwrap();
    let files = PemFiles {
        cert: both.clone(),
        key: dir.path().join("ca.key"),
    };
    let ca = LocalCa::load_or_create(&config::Ca { files: Some(files) }, None).unwrap();
    assert_eq!(ca.cert_pem(), cert_pem);
    assert!(!ca.cert_pem().contains("PRIVATE KEY"));
}

#[test]
fn without_a_data_dir_the_ca_lives_in_memory() {
    let ca = LocalCa::load_or_create(&config::Ca::default(), None).unwrap();
    assert_eq!(ca.cert_path(), None);
    assert!(ca.cert_pem().contains("BEGIN CERTIFICATE"));
    let debug = format!("{ca:?}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
    assert!(!debug.contains("BEGIN"), "{debug}");
}

#[test]
fn a_leaf_verifies_for_its_host_and_not_for_another() {
    let ca = LocalCa::in_memory().unwrap();
    let config = ca.intercept_config("OCR.captchaai.com").unwrap();
    let (leaf, alpn) = handshake(config.clone(), ca.cert_der(), "ocr.captchaai.com").unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    verify(ca.cert_der(), &leaf, "ocr.captchaai.com", SystemTime::now()).unwrap();
    let wrong = handshake(config, ca.cert_der(), "2captcha.com").unwrap_err();
    assert!(
        matches!(wrong, rustls::Error::InvalidCertificate(_)),
        "{wrong:?}"
    );
    assert!(verify(ca.cert_der(), &leaf, "2captcha.com", SystemTime::now()).is_err());
    // Another CA's client does not trust it.
    let stranger = LocalCa::in_memory().unwrap();
    assert!(verify(
        stranger.cert_der(),
        &leaf,
        "ocr.captchaai.com",
        SystemTime::now()
    )
    .is_err());
}

#[test]
fn an_ip_host_gets_an_ip_san() {
    let ca = LocalCa::in_memory().unwrap();
    for (host, name) in [("127.0.0.1", "127.0.0.1"), ("[::1]", "::1")] {
        let config = ca.intercept_config(host).unwrap();
        let (leaf, _) = handshake(config, ca.cert_der(), name).unwrap();
        verify(ca.cert_der(), &leaf, name, SystemTime::now()).unwrap();
    }
}

#[test]
fn a_host_that_is_no_name_is_refused() {
    let ca = LocalCa::in_memory().unwrap();
    for bad in ["", "a b", "bad/host", "-.-", &"x".repeat(300)] {
        let e = ca.intercept_config(bad).unwrap_err();
        assert!(matches!(e, TlsError::Issue { .. }), "{bad:?}: {e:?}");
    }
    assert_eq!(ca.leaves.lock().unwrap().len(), 0);
}

#[test]
fn a_cached_leaf_is_the_same_config_and_is_renewed_near_its_end() {
    let ca = LocalCa::in_memory().unwrap();
    let t0 = SystemTime::now();
    let first = ca.intercept_config_at("2captcha.com", t0).unwrap();
    let again = ca
        .intercept_config_at("2CAPTCHA.com.", t0 + 5 * DAY)
        .unwrap();
    assert!(Arc::ptr_eq(&first, &again), "issued twice within its life");
    let other = ca.intercept_config_at("rucaptcha.com", t0).unwrap();
    assert!(!Arc::ptr_eq(&first, &other));

    // Within a day of the seven-day end: a new leaf, valid then.
    let late = t0 + 6 * DAY + DAY / 2;
    let renewed = ca.intercept_config_at("2captcha.com", late).unwrap();
    assert!(!Arc::ptr_eq(&first, &renewed), "not renewed near its end");
    let issued = ca.issue(&["2captcha.com".to_owned()], late).unwrap();
    verify(
        ca.cert_der(),
        &leaf_of(&issued),
        "2captcha.com",
        late + 6 * DAY,
    )
    .unwrap();
    assert!(verify(
        ca.cert_der(),
        &leaf_of(&issued),
        "2captcha.com",
        late + 8 * DAY
    )
    .is_err());
    // Backdated a little for clocks that are behind, not more.
    let at = |t| verify(ca.cert_der(), &leaf_of(&issued), "2captcha.com", t);
    at(late - Duration::from_secs(1800)).unwrap();
    assert!(at(late - 2 * Duration::from_secs(3600)).is_err());
}

#[test]
fn the_cache_is_bounded() {
    let ca = LocalCa::in_memory().unwrap().with_policy(LeafPolicy {
        max_hosts: 3,
        ..LeafPolicy::default()
    });
    let first = ca.intercept_config("h0.test").unwrap();
    for i in 1..10 {
        ca.intercept_config(&format!("h{i}.test")).unwrap();
    }
    assert_eq!(ca.leaves.lock().unwrap().len(), 3);
    let again = ca.intercept_config("h0.test").unwrap();
    assert!(!Arc::ptr_eq(&first, &again), "the oldest host was kept");
}

#[test]
fn the_ca_certificate_is_a_ca_for_ten_years_named_for_keyrelay() {
    let ca = LocalCa::in_memory().unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
    let constraints = cert
        .basic_constraints()
        .unwrap()
        .expect("basic constraints");
    assert!(constraints.critical);
    assert!(constraints.value.ca);
    let usage = cert.key_usage().unwrap().expect("key usage").value;
    assert!(usage.key_cert_sign());
    let validity = cert.validity();
    let years = (validity.not_after.timestamp() - validity.not_before.timestamp()) / 86_400 / 365;
    assert_eq!(years, 10);
    let subject = cert.subject().to_string();
    assert!(subject.contains("keyrelay local CA on "), "{subject}");

    // A leaf: not a CA, for servers, with the CA's key id.
    let issued = ca.issue(&["x.test".to_owned()], SystemTime::now()).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&issued.key.cert[0]).unwrap();
    assert!(leaf
        .basic_constraints()
        .unwrap()
        .is_none_or(|c| !c.value.ca));
    assert!(
        leaf.extended_key_usage()
            .unwrap()
            .expect("eku")
            .value
            .server_auth
    );
    assert_eq!(leaf.issuer(), cert.subject());
    let hours =
        (leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp()) / 3600;
    assert_eq!(hours, 7 * 24 + 1, "seven days, backdated an hour");
}
