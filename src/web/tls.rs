//! TLS on a service's HTTP listener, the same way on every service: `--tls-cert` and
//! `--tls-key` (PEM) make the port speak HTTPS only (a plaintext request is a failed
//! handshake, never served); `--tls-client-ca` (PEM) asks every client for a certificate that
//! CA signed (mutual TLS, an alternative or an addition to the bearer tokens of
//! [`super::access`]). The files are read again when they change — a rotated certificate is
//! served to the next connection without a restart, connections already open keep theirs — and
//! a file that does not load keeps the last good configuration (logged once per change).
//!
//! rustls with the `ring` provider (already in the tree through the NATS client), TLS 1.2 and
//! 1.3, HTTP/1.1 advertised by ALPN. Handshakes are bounded by `--http-read-timeout`, and every
//! failed one is counted as the `http_tls_handshake` limit hit of the service.
//!
//! Knows no service.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// How often the files are checked for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// The TLS flags every service has (each service gives them its `KVPLANE_<SERVICE>_*`
/// variables).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain of the HTTP listener (leaf first); with `--tls-key` the port
    /// speaks HTTPS only. Re-read when it changes (rotation without a restart).
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `--tls-cert`.
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// PEM bundle of the CAs whose client certificates are accepted: every client must then
    /// present one (mutual TLS). Needs `--tls-cert`.
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
}

/// What the server's TLS is made of: the files it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The client CAs, for mutual TLS.
    pub client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The files, when TLS is asked for.
    pub fn files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

/// Why a TLS configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind needed.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// rustls refused the combination (a key that does not match the certificate, …).
    #[error("TLS configuration refused: {0}")]
    Config(String),
}

/// A server's TLS: the current configuration, replaced when its files change.
#[derive(Clone)]
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<RwLock<Loaded>>,
}

struct Loaded {
    config: Arc<ServerConfig>,
    stamp: Vec<Option<(SystemTime, u64)>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads `files` (at start: an error stops the service).
    ///
    /// # Errors
    /// A file unreadable, not PEM, or refused by rustls.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let config = build(&files)?;
        let stamp = stamps(&files);
        Ok(ServerTls {
            files,
            current: Arc::new(RwLock::new(Loaded { config, stamp })),
        })
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        let loaded = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&loaded.config)
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Re-reads the files if any changed since the last load: `Ok(true)` when a new
    /// configuration is in place, `Ok(false)` when nothing changed.
    ///
    /// # Errors
    /// A changed file that does not load (the last good configuration stays).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files);
        {
            let loaded = self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if loaded.stamp == now {
                return Ok(false);
            }
        }
        let built = build(&self.files);
        let mut loaded = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The stamp moves on either way, so a bad file is reported once per change.
        loaded.stamp = now;
        loaded.config = built?;
        Ok(true)
    }

    /// Checks the files every [`RELOAD_CHECK`] until `shutdown`, logging each reload.
    pub fn watch(&self, what: &'static str, shutdown: CancellationToken) {
        let tls = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_CHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let files = tls.files.clone();
                let tls = tls.clone();
                let reloaded = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
                match reloaded {
                    Ok(Ok(true)) => tracing::info!(
                        "{what}: TLS certificate reloaded from {}",
                        files.cert.display()
                    ),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(
                        "{what}: TLS files changed but do not load ({e}); still serving the \
                         last good certificate"
                    ),
                    Err(e) => tracing::warn!("{what}: TLS reload task failed: {e}"),
                }
            }
        });
    }
}

/// Modification time and length of each file (`None` when it cannot be read).
fn stamps(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len()))
    })
    .collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: format!("not a PEM certificate list: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no CERTIFICATE in it".into(),
        });
    }
    Ok(certs)
}

/// The server configuration of `files`.
fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no usable private key: {e}"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    path: ca.clone(),
                    what: format!("not a CA certificate: {e}"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
