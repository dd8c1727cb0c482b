//! keyrelay's local certificate authority: generated on first start into `data_dir` (or
//! loaded from `[ca]` files, or kept in memory when there is no data dir), and the leaf
//! certificates it signs, cached by host.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::ServerConfig;

use super::leaves::LeafCache;
use super::{files, TlsError};
use crate::config;

const DAY: Duration = Duration::from_secs(86_400);

/// How long the CA is valid: long enough that nobody has to re-trust it.
const CA_VALIDITY: Duration = Duration::from_secs(3650 * 86_400);

/// How leaf certificates are issued and cached.
#[derive(Clone, Copy, Debug)]
pub struct LeafPolicy {
    /// How long a leaf is valid from the moment it is issued.
    pub validity: Duration,
    /// How far before that moment it is valid from, for clients whose clock is behind.
    pub backdate: Duration,
    /// A cached leaf this close to its end is replaced by a new one.
    pub renew_before: Duration,
    /// Hosts the cache holds at most; the oldest issued is dropped first.
    pub max_hosts: usize,
}

impl Default for LeafPolicy {
    fn default() -> LeafPolicy {
        LeafPolicy {
            validity: 7 * DAY,
            backdate: Duration::from_secs(3600),
            renew_before: DAY,
            max_hosts: 10_000,
        }
    }
}

/// A leaf certificate with its key, and the moment it stops being valid.
#[derive(Clone, Debug)]
pub struct Issued {
    pub key: Arc<CertifiedKey>,
    pub not_after: SystemTime,
}

/// The local CA. Its private key never leaves this value: `Debug` shows where the
/// certificate is, nothing else.
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    cert_path: Option<PathBuf>,
    key_path: Option<PathBuf>,
    created: bool,
    policy: LeafPolicy,
    leaves: Mutex<LeafCache<Arc<ServerConfig>>>,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl LocalCa {
    /// The file names of a CA generated into `data_dir`.
    pub const CERT_FILE: &'static str = "ca.pem";
    pub const KEY_FILE: &'static str = "ca.key";

    /// The CA of `[ca]`: loaded from its files if it names them; otherwise
    /// `<data_dir>/ca.pem` and `ca.key`, generated if neither exists; in memory without a
    /// data dir (configs built in code).
    ///
    /// # Errors
    /// A file is unreadable, not PEM, not a certificate or key rcgen can sign with, or the
    /// key is not the certificate's; or only one of the generated pair exists. Nothing is
    /// ever overwritten.
    pub fn load_or_create(ca: &config::Ca, data_dir: Option<&Path>) -> Result<LocalCa, TlsError> {
        if let Some(files) = &ca.files {
            return LocalCa::load(&files.cert, &files.key);
        }
        let Some(dir) = data_dir else {
            return LocalCa::in_memory();
        };
        let cert = dir.join(LocalCa::CERT_FILE);
        let key = dir.join(LocalCa::KEY_FILE);
        match (exists(&cert)?, exists(&key)?) {
            (true, true) => LocalCa::load(&cert, &key),
            (false, false) => LocalCa::create(dir, cert, key),
            (true, false) => Err(TlsError::HalfPair {
                present: cert,
                missing: key,
            }),
            (false, true) => Err(TlsError::HalfPair {
                present: key,
                missing: cert,
            }),
        }
    }

    /// A new CA that lives only as long as this value.
    ///
    /// # Errors
    /// Key generation failed (the system's random source, in practice).
    pub fn in_memory() -> Result<LocalCa, TlsError> {
        let (ca, _key_pem) = LocalCa::generate(SystemTime::now())?;
        Ok(ca)
    }

    /// The same CA, issuing leaves by `policy`.
    #[must_use]
    pub fn with_policy(mut self, policy: LeafPolicy) -> LocalCa {
        self.policy = policy;
        self.leaves = Mutex::new(LeafCache::new(policy.max_hosts));
        self
    }

    /// The CA certificate, PEM: what clients are told to trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Where the certificate is; `None` for an in-memory CA.
    pub fn cert_path(&self) -> Option<&Path> {
        self.cert_path.as_deref()
    }

    /// Where the private key is; `None` for an in-memory CA.
    pub fn key_path(&self) -> Option<&Path> {
        self.key_path.as_deref()
    }

    /// How this CA issues leaves.
    pub fn policy(&self) -> LeafPolicy {
        self.policy
    }

    /// Whether this call generated the CA's files (rather than finding them).
    pub fn was_created(&self) -> bool {
        self.created
    }

    /// A server config presenting a leaf for `host` (a DNS name or an IP address), signed
    /// by this CA: what the forward proxy terminates an intercepted `CONNECT` with. Issued
    /// at most once per host while valid, renewed near its end.
    ///
    /// # Errors
    /// `host` is not a DNS name or IP address.
    pub fn intercept_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        self.intercept_config_at(host, SystemTime::now())
    }

    /// [`LocalCa::intercept_config`] as of `now`.
    ///
    /// # Errors
    /// `host` is not a DNS name or IP address.
    pub fn intercept_config_at(
        &self,
        host: &str,
        now: SystemTime,
    ) -> Result<Arc<ServerConfig>, TlsError> {
        let host = normalize_host(host)?;
        // Issued under the lock, so that concurrent CONNECTs to one host issue one leaf.
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(config) = leaves.fresh(&host, now, self.policy.renew_before) {
            return Ok(config);
        }
        let issued = self.issue(std::slice::from_ref(&host), now)?;
        let config = super::server_config(Arc::new(SingleCertAndKey::from(issued.key)));
        leaves.insert(&host, config.clone(), issued.not_after);
        Ok(config)
    }

    /// A leaf for `names` (DNS names or IP addresses; the first is its common name), valid
    /// from `now` for the policy's validity.
    ///
    /// # Errors
    /// A name is not a DNS name or IP address, or signing failed.
    pub fn issue(&self, names: &[String], now: SystemTime) -> Result<Issued, TlsError> {
        let first = names.first().map_or("", String::as_str);
        let problem = |problem: String| TlsError::Issue {
            host: first.to_owned(),
            problem,
        };
        let mut params = CertificateParams::default();
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => name
                    .clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|e| problem(format!("{name:?} is not a DNS name: {e}"))),
            })
            .collect::<Result<_, _>>()?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, first);
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // Strict verifiers (Python 3.13's default) want the authority key id on leaves.
        params.use_authority_key_identifier_extension = true;
        let not_after = now + self.policy.validity;
        params.not_before = (now - self.policy.backdate).into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial());
        let key = KeyPair::generate().map_err(|e| problem(format!("key generation: {e}")))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| problem(format!("signing: {e}")))?;
        let der = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing_key = super::provider()
            .key_provider
            .load_private_key(der)
            .map_err(|e| problem(format!("loading the new key: {e}")))?;
        Ok(Issued {
            key: Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing_key)),
            not_after,
        })
    }

    /// A new CA certificate and key, and the key's PEM (a secret: only for its file).
    fn generate(now: SystemTime) -> Result<(LocalCa, String), TlsError> {
        let fail = |e: rcgen::Error| TlsError::Issue {
            host: "the local CA".to_owned(),
            problem: e.to_string(),
        };
        let key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("keyrelay local CA on {}", machine_name()),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, "keyrelay");
        // Path length 0: it signs leaves, never another CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = (now - DAY).into();
        params.not_after = (now + CA_VALIDITY).into();
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(fail)?;
        let key_pem = key.serialize_pem();
        let ca = LocalCa::from_parts(Issuer::new(params, key), cert.der().clone(), cert.pem());
        Ok((ca, key_pem))
    }

    /// Generates a CA into `dir`: the key first, created private, then the certificate.
    fn create(dir: &Path, cert_path: PathBuf, key_path: PathBuf) -> Result<LocalCa, TlsError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| TlsError::file(dir, format!("cannot create the directory: {e}")))?;
        let (mut ca, key_pem) = LocalCa::generate(SystemTime::now())?;
        files::write_new(&key_path, key_pem.as_bytes(), true)?;
        files::write_new(&cert_path, ca.cert_pem.as_bytes(), false)?;
        tracing::info!(cert = %cert_path.display(), key = %key_path.display(),
            "generated the local CA; `keyrelay ca` says how to trust it");
        ca.cert_path = Some(cert_path);
        ca.key_path = Some(key_path);
        ca.created = true;
        Ok(ca)
    }

    fn load(cert_path: &Path, key_path: &Path) -> Result<LocalCa, TlsError> {
        let cert_bytes = files::read(cert_path)?;
        let cert = files::certs(cert_path, &cert_bytes)?.remove(0);
        let key_der = files::key(key_path, &files::read(key_path)?)?;
        let key = KeyPair::try_from(&key_der).map_err(|e| {
            let hint = match key_der {
                PrivateKeyDer::Pkcs8(_) => String::new(),
                _ => "; convert it to PKCS#8 with `openssl pkcs8 -topk8 -nocrypt`".to_owned(),
            };
            TlsError::file(key_path, format!("cannot sign with this key: {e}{hint}"))
        })?;
        // The key must be the certificate's, or every leaf it signs fails to verify.
        let signing_key = super::provider()
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| TlsError::file(key_path, format!("unusable private key: {e}")))?;
        match CertifiedKey::new(vec![cert.clone()], signing_key).keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(TlsError::file(
                    key_path,
                    format!(
                        "is not the private key of the certificate in {}",
                        cert_path.display()
                    ),
                ))
            }
            Err(e) => {
                return Err(TlsError::file(
                    cert_path,
                    format!("not a usable certificate: {e}"),
                ))
            }
        }
        let issuer = Issuer::from_ca_cert_der(&cert, key)
            .map_err(|e| TlsError::file(cert_path, format!("not a usable CA certificate: {e}")))?;
        if files::readable_by_others(key_path) {
            tracing::warn!(key = %key_path.display(),
                "the CA private key is readable by other users; chmod 600 it");
        }
        let pem = certificate_sections(&String::from_utf8_lossy(&cert_bytes));
        let mut ca = LocalCa::from_parts(issuer, cert, pem);
        ca.cert_path = Some(cert_path.to_owned());
        ca.key_path = Some(key_path.to_owned());
        Ok(ca)
    }

    fn from_parts(
        issuer: Issuer<'static, KeyPair>,
        cert_der: CertificateDer<'static>,
        cert_pem: String,
    ) -> LocalCa {
        let policy = LeafPolicy::default();
        LocalCa {
            issuer,
            cert_der,
            cert_pem,
            cert_path: None,
            key_path: None,
            created: false,
            policy,
            leaves: Mutex::new(LeafCache::new(policy.max_hosts)),
        }
    }
}

/// Whether `path` exists, or an error naming it when that cannot be told.
fn exists(path: &Path) -> Result<bool, TlsError> {
    path.try_exists()
        .map_err(|e| TlsError::file(path, format!("cannot tell whether it exists: {e}")))
}

/// `host` as a certificate names it: lowercase, without IPv6 brackets or a final dot;
/// refused unless it is a DNS name or an IP address, since it may come from a caller.
fn normalize_host(host: &str) -> Result<String, TlsError> {
    let trimmed = host.trim();
    let bare = trimmed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(trimmed);
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    match ServerName::try_from(name.as_str()) {
        Ok(_) if !name.is_empty() => Ok(name),
        _ => Err(TlsError::Issue {
            host: host.chars().take(256).collect(),
            problem: "not a DNS name or IP address".to_owned(),
        }),
    }
}

/// The `CERTIFICATE` sections of a PEM text, and nothing else: a file that holds the key
/// too must not have it printed by `keyrelay ca --pem`.
fn certificate_sections(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        out.push_str(&rest[start..start + len + END.len()]);
        out.push('\n');
        rest = &rest[start + len + END.len()..];
    }
    out
}

/// A random positive serial: browsers refuse two certificates from one issuer with the
/// same serial, and a restarted keyrelay must not repeat one.
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

/// The machine's name, for the CA's name: several keyrelays' CAs in one trust store can
/// then be told apart.
fn machine_name() -> String {
    crate::host::name(48).unwrap_or_else(|| "this machine".to_owned())
}

#[cfg(test)]
mod tests;
