//! TLS on a real socket: HTTPS served, plaintext refused and counted, a rotated certificate
//! served to the next connection, and mutual TLS refusing a missing or foreign client
//! certificate. Certificates are made here (rcgen); the client is rustls's.

use super::*;
use crate::web::limits::{HttpLimits, LimitHit, LimitHook, WebLimit};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        Pki {
            ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A leaf certificate and its key, PEM.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap();
    p
}

fn counting_hook() -> (LimitHook, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&hits);
    let hook: LimitHook = Arc::new(move |hit: LimitHit, _detail: &str| {
        if hit.limit == WebLimit::TlsHandshake {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    (hook, hits)
}

async fn start(tls: ServerTls) -> (std::net::SocketAddr, Arc<AtomicU64>, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" }));
    let (hook, hits) = counting_hook();
    let stop = CancellationToken::new();
    let limits = HttpLimits {
        read_timeout: Duration::from_secs(5),
        ..HttpLimits::default()
    };
    tokio::spawn(crate::web::serve_tls(
        listener,
        router,
        limits,
        hook,
        stop.clone(),
        Some(tls),
    ));
    (addr, hits, stop)
}

fn client(ca_pem: &str, identity: Option<(&str, &str)>) -> tokio_rustls::TlsConnector {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One GET /healthz over TLS: the answer's text and the server's leaf certificate.
async fn get(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> std::io::Result<(String, Vec<u8>)> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await?;
    Ok((answer, leaf))
}

#[tokio::test]
async fn https_is_served_plaintext_refused_and_a_rotated_certificate_taken() {
    let dir = tempdir();
    let pki = Pki::new("test CA");
    let (cert, key) = pki.leaf(&["127.0.0.1", "localhost"]);
    let files = TlsFiles {
        cert: write(&dir, "cert.pem", &cert),
        key: write(&dir, "key.pem", &key),
        client_ca: None,
    };
    let tls = ServerTls::load(files.clone()).unwrap();
    let (addr, hits, stop) = start(tls.clone()).await;
    let connector = client(&pki.ca.pem(), None);

    let (answer, first_leaf) = get(addr, &connector).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok\n"),
        "{answer}"
    );

    // A plaintext request gets no HTTP answer, and the failed handshake is counted.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply).await;
    assert!(!reply.starts_with(b"HTTP/1.1 200"), "{reply:?}");
    crate::web::testing::until(|| hits.load(Ordering::Relaxed) == 1).await;

    // Rotation: new files, one check, the next connection gets the new certificate.
    let (cert2, key2) = pki.leaf(&["127.0.0.1"]);
    std::fs::write(&files.cert, &cert2).unwrap();
    std::fs::write(&files.key, &key2).unwrap();
    assert!(tls.reload_if_changed().unwrap(), "the change is seen");
    assert!(!tls.reload_if_changed().unwrap(), "once");
    let (_, second_leaf) = get(addr, &connector).await.unwrap();
    assert_ne!(first_leaf, second_leaf);

    // A broken file keeps the last good certificate.
    std::fs::write(&files.key, "not a key").unwrap();
    assert!(tls.reload_if_changed().is_err());
    let (answer, third_leaf) = get(addr, &connector).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(second_leaf, third_leaf);
    stop.cancel();
}

#[tokio::test]
async fn mutual_tls_refuses_a_missing_or_foreign_client_certificate() {
    let dir = tempdir();
    let pki = Pki::new("fleet CA");
    let (cert, key) = pki.leaf(&["127.0.0.1"]);
    let files = TlsFiles {
        cert: write(&dir, "cert.pem", &cert),
        key: write(&dir, "key.pem", &key),
        client_ca: Some(write(&dir, "ca.pem", &pki.ca.pem())),
    };
    let tls = ServerTls::load(files).unwrap();
    assert!(tls.mutual());
    let (addr, hits, stop) = start(tls).await;

    let (client_cert, client_key) = pki.leaf(&["client"]);
    let ours = client(&pki.ca.pem(), Some((&client_cert, &client_key)));
    let (answer, _) = get(addr, &ours).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let none = client(&pki.ca.pem(), None);
    assert!(get(addr, &none).await.is_err(), "no client certificate");
    let other = Pki::new("other CA");
    let (foreign_cert, foreign_key) = other.leaf(&["client"]);
    let foreign = client(&pki.ca.pem(), Some((&foreign_cert, &foreign_key)));
    assert!(
        get(addr, &foreign).await.is_err(),
        "a foreign CA's certificate"
    );
    crate::web::testing::until(|| hits.load(Ordering::Relaxed) == 2).await;
    stop.cancel();
}

#[test]
fn bad_files_are_named() {
    let dir = tempdir();
    let files = TlsFiles {
        cert: write(&dir, "cert.pem", "no pem here"),
        key: write(&dir, "key.pem", "nor here"),
        client_ca: None,
    };
    let e = ServerTls::load(files).unwrap_err().to_string();
    assert!(e.contains("cert.pem") && e.contains("CERTIFICATE"), "{e}");
    let missing = TlsFiles {
        cert: dir.join("absent.pem"),
        key: dir.join("absent.key"),
        client_ca: None,
    };
    let e = ServerTls::load(missing).unwrap_err().to_string();
    assert!(e.contains("absent.pem"), "{e}");
}

/// A fresh folder under the system's temporary directory.
fn tempdir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kvplane-tls-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
