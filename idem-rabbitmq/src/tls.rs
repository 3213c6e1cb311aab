//! TLS to the broker as production brokers use it: a private CA to trust, and a client
//! certificate to present when the broker authenticates clients by certificate.

use std::fmt;
use std::path::Path;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

/// The TLS settings of `amqps://` connections ([`AmqpUrl::tls`](crate::AmqpUrl::tls)): the
/// certificates to trust besides the platform's roots, and the client's certificate and key.
/// Needs the `tls` feature to connect.
///
/// ```no_run
/// use idem_rabbitmq::{AmqpUrl, TlsSettings};
/// # fn demo() -> Result<(), idem_rabbitmq::TlsError> {
/// let tls = TlsSettings::new()
///     .ca_file("/etc/rabbitmq/ca.pem")?
///     .client_certificate("/etc/billing/client.pem", "/etc/billing/client.key")?;
/// let url = AmqpUrl::new("amqps://billing@rabbit.internal:5671/%2f").tls(tls);
/// # Ok(()) }
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    ca_pem: Option<String>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        /// What the file was to hold.
        what: &'static str,
        /// Its path.
        path: String,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no PEM block of the expected kind.
    #[error("the {what} {path} holds no PEM {expected} block")]
    NotPem {
        /// What the file was to hold.
        what: &'static str,
        /// Its path.
        path: String,
        /// The block looked for.
        expected: &'static str,
    },
}

impl TlsSettings {
    /// The platform's root certificates only, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificates in the PEM file at `path` (a private CA) besides the platform's.
    ///
    /// # Errors
    ///
    /// The file cannot be read or holds no certificate.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Result<Self, TlsError> {
        let pem = read_pem(path.as_ref(), "CA file", "CERTIFICATE")?;
        self.ca_pem = Some(String::from_utf8_lossy(&pem).into_owned());
        Ok(self)
    }

    /// Presents the certificate (chain) in the PEM file `certificate`, with the private key in
    /// the PEM file `key` (PKCS#8, PKCS#1 or SEC1), to a broker that authenticates clients by
    /// certificate.
    ///
    /// # Errors
    ///
    /// A file cannot be read or holds no block of its kind.
    pub fn client_certificate(
        mut self,
        certificate: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, TlsError> {
        let certificate = read_pem(certificate.as_ref(), "client certificate", "CERTIFICATE")?;
        let key = read_pem(key.as_ref(), "client key", "PRIVATE KEY")?;
        self.client = Some((certificate, key));
        Ok(self)
    }

    /// lapin's form of the settings.
    pub(crate) fn lapin_config(&self) -> OwnedTLSConfig {
        OwnedTLSConfig {
            identity: self.client.as_ref().map(|(pem, key)| OwnedIdentity::PKCS8 {
                pem: pem.clone(),
                key: key.clone(),
            }),
            cert_chain: self.ca_pem.clone(),
        }
    }
}

/// Never shows the key.
impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// The file at `path`, which must hold a PEM block whose label ends with `label`.
fn read_pem(path: &Path, what: &'static str, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: shown.clone(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let has_block = text.lines().any(|line| {
        line.starts_with("-----BEGIN ") && line.trim_end().ends_with(&format!("{label}-----"))
    });
    if !has_block {
        return Err(TlsError::NotPem {
            what,
            path: shown,
            expected: label,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("idem-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    #[test]
    fn files_of_the_right_kind_make_lapin_s_settings() {
        let tls = TlsSettings::new()
            .ca_file(file("ca.pem", CERTIFICATE))
            .unwrap()
            .client_certificate(file("client.pem", CERTIFICATE), file("client.key", KEY))
            .unwrap();
        let config = tls.lapin_config();
        assert_eq!(config.cert_chain.as_deref(), Some(CERTIFICATE));
        assert!(matches!(
            config.identity,
            Some(OwnedIdentity::PKCS8 { ref pem, ref key }) if pem == CERTIFICATE.as_bytes() && key == KEY.as_bytes()
        ));
        // The key never shows.
        assert!(!format!("{tls:?}").contains("MIIE"));
        assert_eq!(TlsSettings::new().lapin_config(), OwnedTLSConfig::default());
    }

    #[test]
    fn a_missing_file_or_one_of_the_wrong_kind_is_named() {
        let missing = TlsSettings::new()
            .ca_file("/nonexistent/ca.pem")
            .unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("cannot read the CA file /nonexistent/ca.pem"),
            "{missing}"
        );
        let key_as_ca = TlsSettings::new()
            .ca_file(file("key-as-ca.pem", KEY))
            .unwrap_err();
        assert!(
            matches!(
                key_as_ca,
                TlsError::NotPem {
                    what: "CA file",
                    ..
                }
            ),
            "{key_as_ca}"
        );
        let swapped = TlsSettings::new()
            .client_certificate(file("c2.pem", CERTIFICATE), file("c2.key", CERTIFICATE))
            .unwrap_err();
        assert!(
            swapped
                .to_string()
                .contains("holds no PEM PRIVATE KEY block"),
            "{swapped}"
        );
    }
}
