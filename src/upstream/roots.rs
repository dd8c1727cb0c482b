//! The trust roots of `https://` upstreams: the Mozilla roots, and the CA certificates of
//! `upstream_ca` beside them, for a firewall that inspects outgoing TLS or a service behind
//! a private CA.
//!
//! Problems are told in keyrelay's own words, never with the PEM parser's `Display`, which
//! may quote a line of the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// Why the `upstream_ca` file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("upstream_ca {}: {problem}", path.display())]
pub struct RootsError {
    path: PathBuf,
    problem: String,
}

/// The roots https upstreams are checked against: the Mozilla roots, and the CA
/// certificates of the PEM file `upstream_ca` names, if any. Other PEM sections in the file
/// (a private key left in the bundle) are passed over.
///
/// # Errors
/// [`RootsError`] naming the file: unreadable, not PEM, no certificate, or a certificate
/// rustls cannot trust as a root.
pub fn configured(upstream_ca: Option<&Path>) -> Result<RootCertStore, RootsError> {
    let mut roots = RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let Some(path) = upstream_ca else {
        return Ok(roots);
    };
    let problem = |problem: String| RootsError {
        path: path.to_owned(),
        problem,
    };
    let pem = std::fs::read(path).map_err(|e| problem(format!("cannot read it: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| problem("not a readable PEM file of certificates".to_owned()))?;
    if certs.is_empty() {
        return Err(problem(
            "no certificate in it (expected a PEM \"BEGIN CERTIFICATE\" section)".to_owned(),
        ));
    }
    let count = certs.len();
    for (n, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            problem(format!(
                "certificate {} of {count} cannot be a trust root: {e}",
                n + 1
            ))
        })?;
    }
    Ok(roots)
}

/// The upstream client's TLS settings: rustls' safe defaults and `roots`.
pub(super) fn client_config(
    provider: Arc<CryptoProvider>,
    roots: RootCertStore,
) -> Result<ClientConfig, rustls::Error> {
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("roots.pem");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn every_certificate_of_a_bundle_is_read_and_other_sections_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = format!(
            "{}\n-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{}",
            ca_pem(),
            ca_pem()
        );
        let mozilla = configured(None).unwrap().len();
        assert!(mozilla > 100, "the Mozilla roots: {mozilla}");
        let roots = configured(Some(&file(&dir, &bundle))).unwrap();
        assert_eq!(roots.len(), mozilla + 2);
        let config = client_config(Arc::new(rustls::crypto::ring::default_provider()), roots);
        assert!(config.is_ok());
    }

    #[test]
    fn an_unusable_file_is_refused_naming_it_and_never_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "hunter2-line-of-the-file";
        let cases = [
            (
                format!("{secret}\n"),
                "no certificate in it (expected a PEM \"BEGIN CERTIFICATE\" section)",
            ),
            (String::new(), "no certificate in it"),
            (
                format!("-----BEGIN CERTIFICATE-----\n{secret}!!\n-----END CERTIFICATE-----\n"),
                "not a readable PEM file of certificates",
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_owned(),
                "certificate 1 of 1 cannot be a trust root",
            ),
        ];
        for (text, want) in cases {
            let path = file(&dir, &text);
            let message = configured(Some(&path)).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!("upstream_ca {}: ", path.display())),
                "{message}"
            );
            assert!(message.contains(want), "{text:?}: {message}");
            assert!(!message.contains(secret), "{message}");
        }
        let missing = dir.path().join("missing.pem");
        let message = configured(Some(&missing)).unwrap_err().to_string();
        assert!(message.contains("cannot read it"), "{message}");
    }
}
