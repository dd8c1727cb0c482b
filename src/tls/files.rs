//! Certificate and key files: PEM read with rustls-pki-types' `PemObject` into what rustls
//! and rcgen use, a new file written without ever being readable by others, and the
//! fingerprint a reload compares.
//!
//! Problems are described in keyrelay's own words rather than with the PEM parser's
//! `Display`, which may quote a line of the file: the line could be key material.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::TlsError;
use crate::config::PemFiles;

/// The bytes of `path`, or an error naming it.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::file(path, format!("cannot read it: {e}")))
}

/// Every certificate in `pem`, read from `path`, in order: the first is the end entity.
pub(super) fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::file(path, pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(TlsError::file(
            path,
            "no certificate in it (expected a PEM \"BEGIN CERTIFICATE\" section)",
        ));
    }
    Ok(certs)
}

/// The private key in `pem`, read from `path`.
pub(super) fn key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::file(
            path,
            "no private key in it (expected a PEM \"BEGIN PRIVATE KEY\", \
             \"BEGIN EC PRIVATE KEY\" or \"BEGIN RSA PRIVATE KEY\" section)",
        ),
        other => TlsError::file(path, pem_problem(&other)),
    })
}

/// A certificate chain and its key from `files`, checked to belong together.
pub(super) fn certified_key(files: &PemFiles) -> Result<CertifiedKey, TlsError> {
    let chain = certs(&files.cert, &read(&files.cert)?)?;
    let key = key(&files.key, &read(&files.key)?)?;
    let signing_key = super::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::file(&files.key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::file(
            &files.key,
            format!(
                "is not the private key of the certificate in {}",
                files.cert.display()
            ),
        )),
        Err(e) => Err(TlsError::file(
            &files.cert,
            format!("not a usable certificate: {e}"),
        )),
    }
}

/// What a PEM parse error means, without quoting the file.
fn pem_problem(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line".to_owned(),
        pem::Error::IllegalSectionStart { .. } => "a malformed PEM BEGIN line".to_owned(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".to_owned(),
        pem::Error::Io(io) => format!("cannot read it: {io}"),
        pem::Error::NoItemsFound => "no PEM section in it".to_owned(),
        pem::Error::SectionTooLarge => "a PEM section is too large".to_owned(),
        _ => "not a valid PEM file".to_owned(),
    }
}

/// A fingerprint of the files' modification times and contents; `None` while either
/// cannot be read (mid-rename, say), so that its reappearance counts as a change.
pub(super) fn fingerprint(files: &PemFiles) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    for path in [&files.cert, &files.key] {
        let modified = std::fs::metadata(path).ok()?.modified().ok();
        modified.hash(&mut hasher);
        std::fs::read(path).ok()?.hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// Writes `contents` to a new file at `path`, never replacing one. A `private` file is
/// created with mode 0600, so it is not readable by others at any moment, not even
/// between its creation and a chmod.
pub(super) fn write_new(path: &Path, contents: &[u8], private: bool) -> Result<(), TlsError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options
        .open(path)
        .map_err(|e| TlsError::file(path, format!("cannot create it: {e}")))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| TlsError::file(path, format!("cannot write it: {e}")))
}

/// Whether the file at `path` can be read by users other than its owner.
#[cfg(unix)]
pub(super) fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0)
}

#[cfg(not(unix))]
pub(super) fn readable_by_others(_: &Path) -> bool {
    false
}
