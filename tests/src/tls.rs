//! A TLS listener in front of the broker, as production brokers have one, with certificates
//! made here: a private CA, the listener's certificate for 127.0.0.1 signed by it, and a client
//! certificate signed by it, written to PEM files for the code under test to read.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use crate::unique;

/// A CA and what it signed, in a directory of their own (removed when dropped).
#[derive(Debug)]
pub struct Certificates {
    dir: PathBuf,
    /// The CA's certificate (PEM): what a client trusts to reach the listener.
    pub ca_file: PathBuf,
    /// A client certificate the CA signed (PEM).
    pub client_certificate: PathBuf,
    /// The client certificate's private key (PEM, PKCS#8).
    pub client_key: PathBuf,
    ca: CertificateDer<'static>,
    server: CertificateDer<'static>,
    server_key: Vec<u8>,
}

impl Certificates {
    /// Makes a CA named `name` and signs a listener's and a client's certificate with it.
    pub fn make(name: &str) -> Self {
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca_params = CertificateParams::new(Vec::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        (ca_params.distinguished_name).push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let ca = ca_params
            .self_signed(&ca_key)
            .expect("the CA's certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let signed = |names: Vec<String>| {
            let key = KeyPair::generate().expect("a key");
            let params = CertificateParams::new(names).expect("certificate parameters");
            let certificate = params
                .signed_by(&key, &issuer)
                .expect("a signed certificate");
            (certificate, key)
        };
        let (server, server_key) = signed(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client, client_key) = signed(vec!["billing".into()]);

        let dir = std::env::temp_dir().join(unique("idem-tls"));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        let write = |file: &str, pem: String| {
            let path = dir.join(file);
            std::fs::write(&path, pem).expect("a certificate file");
            path
        };
        Self {
            ca_file: write("ca.pem", ca.pem()),
            client_certificate: write("client.pem", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
            dir: dir.clone(),
            ca: ca.der().clone(),
            server: server.der().clone(),
            server_key: server_key.serialize_der(),
        }
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the listener asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Any client may connect.
    None,
    /// Only a client presenting a certificate the CA signed.
    Required,
}

/// A TLS listener on 127.0.0.1 that forwards each connection, decrypted, to `target`.
#[derive(Debug)]
pub struct TlsListener {
    port: u16,
    task: JoinHandle<()>,
}

impl TlsListener {
    /// Listens with the certificate `certificates` signed for it.
    pub async fn start(target: &str, certificates: &Certificates, clients: ClientAuth) -> Self {
        let provider = Arc::new(ring::default_provider());
        let acceptor = TlsAcceptor::from(Arc::new(server_config(&provider, certificates, clients)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let target = target.to_owned();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, target) = (acceptor.clone(), target.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut broker) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        Self { port, task }
    }

    /// The broker's `amqps://` URL through this listener.
    pub fn url(&self) -> String {
        format!("amqps://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn server_config(
    provider: &Arc<CryptoProvider>,
    certificates: &Certificates,
    clients: ClientAuth,
) -> ServerConfig {
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = match clients {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Required => {
            let mut roots = RootCertStore::empty();
            roots.add(certificates.ca.clone()).expect("the CA");
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
                    .build()
                    .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certificates.server_key.clone()));
    builder
        .with_single_cert(vec![certificates.server.clone()], key)
        .expect("the listener's certificate")
}
