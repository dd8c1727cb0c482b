//! `keyrelay ca`: where the local CA certificate is, and how each kind of client comes to
//! trust it.

use keyrelay::tls::LocalCa;

use super::{load_config, ConfigPath};

/// `keyrelay ca`: the CA certificate's path and, for each client family, how to trust
/// it; with `--pem`, the certificate alone. Creating the CA here lets a user trust it
/// before keyrelay first starts.
pub fn ca(source: &ConfigPath, pem: bool) -> anyhow::Result<()> {
    let config = load_config(source)?;
    let ca = LocalCa::load_or_create(&config.ca, config.data_dir.as_deref())?;
    if pem {
        print!("{}", ca.cert_pem());
        return Ok(());
    }
    let cert = ca.cert_path().map_or_else(
        || "(in memory)".to_owned(),
        |path| path.display().to_string(),
    );
    let state = if ca.was_created() {
        "generated just now"
    } else {
        "existing"
    };
    println!("keyrelay's local CA certificate ({state}):\n  {cert}\n");
    println!("Trust it in the clients that talk to keyrelay over TLS:");
    for (who, how) in [
        ("Python requests", format!("export REQUESTS_CA_BUNDLE={cert}")),
        ("httpx, Go, OpenSSL, curl", format!("export SSL_CERT_FILE={cert}")),
        ("Node.js", format!("export NODE_EXTRA_CA_CERTS={cert}")),
        (
            "the system store (Debian, Ubuntu)",
            format!(
                "sudo cp {cert} /usr/local/share/ca-certificates/keyrelay-ca.crt \\\n      && sudo update-ca-certificates"
            ),
        ),
    ] {
        println!("  {who}:\n    {how}");
    }
    println!(
        "\nREQUESTS_CA_BUNDLE and SSL_CERT_FILE replace the default roots: for a script that \
         also reaches\nother HTTPS sites, point them at a bundle holding both, for example\n    \
         cat \"$(python3 -m certifi)\" {cert} > keyrelay-bundle.pem\n\
         `keyrelay ca --pem` writes the certificate alone to stdout."
    );
    if let Some(key) = ca.key_path() {
        println!(
            "\nKeep the CA's private key secret: {}\nAnyone who has it can impersonate any \
             HTTPS site to every client that trusts this CA.",
            key.display()
        );
    }
    Ok(())
}
