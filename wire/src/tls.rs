//! TLS for the wire protocol, on rustls: the server's modes (`--tlsMode`), certificates and
//! keys from PEM files, the acceptor that tells a TLS client from a plain one on the same port,
//! and the client side (a router reaching its shards).
//!
//! Invariants:
//! * `disabled` never reads a TLS handshake; `requireTLS` closes a plain connection before
//!   reading anything else from it; `allowTLS` and `preferTLS` serve both on one port, told
//!   apart by the first bytes (a TLS handshake record starts `0x16 0x03 0x0N`; a wire message
//!   starts with its length);
//! * with a CA file the server asks for a client certificate and verifies it against that CA;
//!   it requires one unless allowed without (`--tlsAllowConnectionsWithoutCertificates`);
//! * a client verifies the server's certificate against its CA file and the name or address
//!   it dialled; with a certificate-key file it presents that certificate;
//! * the server sends no TLS 1.3 session tickets, so an idle pooled connection carries no
//!   unasked bytes (the pool's staleness check reads the raw socket);
//! * a new connection has one bounded time ([`HANDSHAKE_TIMEOUT`], or the server's shorter
//!   frame timeout) to show whether it speaks TLS and finish its handshake, else it is closed;
//! * after the handshake, a record's first byte starts its frame's time ([`Arrivals`]): a
//!   client that trickles a record is closed at the frame timeout, as one trickling a frame.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::connection::Transport;

/// `--tlsMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disabled,
    Allow,
    Prefer,
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<TlsMode, String> {
        match s {
            "disabled" => Ok(TlsMode::Disabled),
            "allowTLS" => Ok(TlsMode::Allow),
            "preferTLS" => Ok(TlsMode::Prefer),
            "requireTLS" => Ok(TlsMode::Require),
            other => Err(format!(
                "unknown TLS mode {other:?}: one of disabled, allowTLS, preferTLS, requireTLS"
            )),
        }
    }
}

/// The files TLS is configured with.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM with the certificate chain and its private key (`--tlsCertificateKeyFile`).
    pub certificate_key: Option<PathBuf>,
    /// PEM with the CA certificates to verify peers (`--tlsCAFile`).
    pub ca: Option<PathBuf>,
    /// Accept clients without a certificate even with a CA file.
    pub allow_without_client_certificate: bool,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("reading certificates from {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("reading the private key from {}: {e}", path.display()))
}

fn roots(path: &Path) -> Result<Arc<rustls::RootCertStore>, String> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certificates(path)? {
        store
            .add(cert)
            .map_err(|e| format!("a CA certificate in {}: {e}", path.display()))?;
    }
    Ok(Arc::new(store))
}

/// A server's TLS: its mode and, unless disabled, its acceptor.
pub struct ServerTls {
    mode: TlsMode,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mode", &self.mode)
            .finish()
    }
}

/// The longest a new connection may take to show whether it speaks TLS and to finish the
/// handshake, together (a shorter frame timeout shortens it: see [`ServerTls::accept`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl ServerTls {
    /// The server's TLS for `mode`; `None` when disabled. Any other mode needs a
    /// certificate-key file.
    pub fn new(mode: TlsMode, files: &TlsFiles) -> Result<Option<Arc<ServerTls>>, String> {
        if mode == TlsMode::Disabled {
            return Ok(None);
        }
        let path = files
            .certificate_key
            .as_deref()
            .ok_or("a TLS mode other than disabled needs --tlsCertificateKeyFile")?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &files.ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots(ca)?,
                    provider(),
                );
                let verifier = if files.allow_without_client_certificate {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certificates(path)?, private_key(path)?)
            .map_err(|e| format!("the certificate and key in {}: {e}", path.display()))?;
        config.send_tls13_tickets = 0;
        Ok(Some(Arc::new(ServerTls {
            mode,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })))
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The connection's transport: TLS when the client starts a handshake, plain when it does
    /// not and the mode allows it; `None` when it must be closed (plain under `requireTLS`, a
    /// failed handshake, or no transport within `min(timeout, HANDSHAKE_TIMEOUT)` of the call:
    /// one deadline covers telling TLS from plain and the whole handshake, so a client that
    /// trickles its handshake cannot hold the connection longer).
    pub async fn accept(&self, stream: TcpStream, timeout: Duration) -> Option<Box<dyn Transport>> {
        let timeout = timeout.min(HANDSHAKE_TIMEOUT);
        let deadline = tokio::time::Instant::now() + timeout;
        let first = match tokio::time::timeout_at(deadline, first_bytes(&stream)).await {
            Ok(Ok(first)) => first,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "connection failed before its first bytes");
                return None;
            }
            Err(_) => {
                tracing::info!(
                    ?timeout,
                    "closing a connection that sent no handshake in time"
                );
                return None;
            }
        };
        if !is_tls_handshake(&first) {
            if self.mode == TlsMode::Require {
                tracing::debug!("a plain connection refused: TLS is required");
                return None;
            }
            return Some(Box::new(stream));
        }
        let stream = Arrivals {
            tcp: stream,
            since: None,
        };
        match tokio::time::timeout_at(deadline, self.acceptor.accept(stream)).await {
            Ok(Ok(mut tls)) => {
                // The handshake's records are done with; a frame's begin with the next byte.
                tls.handed_out();
                Some(Box::new(tls))
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::info!(
                    ?timeout,
                    "closing a connection whose TLS handshake took too long"
                );
                None
            }
        }
    }
}

/// Up to the first three bytes the client sends, without consuming them. While fewer have
/// arrived the socket stays readable, so the peek is retried after a pause, doubled each time
/// (5 ms up to 100 ms): a client that sends one byte and stops costs a few wakeups a second
/// until the handshake deadline, not two hundred.
async fn first_bytes(stream: &TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; 3];
    let mut pause = Duration::from_millis(5);
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 || n >= 3 {
            return Ok(buf[..n].to_vec());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// A TLS record of type handshake (22) in TLS 1.0 to 1.3's record version.
pub fn is_tls_handshake(first: &[u8]) -> bool {
    matches!(first, [0x16, 0x03, minor, ..] if *minor <= 0x04)
}

/// A client's TLS: the CA to verify servers with and, optionally, its own certificate.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    pub fn new(files: &TlsFiles) -> Result<ClientTls, String> {
        let ca = files
            .ca
            .as_deref()
            .ok_or("TLS to the shards needs --tlsCAFile to verify them")?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(ca)?);
        let config = match &files.certificate_key {
            Some(path) => builder
                .with_client_auth_cert(certificates(path)?, private_key(path)?)
                .map_err(|e| format!("the certificate and key in {}: {e}", path.display()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// TLS over `stream` to `host` (a name or an address, as dialled).
    pub async fn connect(
        &self,
        host: &str,
        stream: TcpStream,
    ) -> std::io::Result<Box<dyn Transport>> {
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
        })?;
        Ok(Box::new(self.connector.connect(name, stream).await?))
    }
}

/// A client's TCP stream under TLS, noting when bytes arrive that no record has handed out
/// yet: a client trickling a record shows only in its raw bytes.
pub struct Arrivals {
    tcp: TcpStream,
    since: Option<tokio::time::Instant>,
}

impl AsyncRead for Arrivals {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before && self.since.is_none() {
            self.since = Some(tokio::time::Instant::now());
        }
        read
    }
}

impl AsyncWrite for Arrivals {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Transport for tokio_rustls::server::TlsStream<Arrivals> {
    fn tcp(&self) -> &TcpStream {
        &self.get_ref().0.tcp
    }

    fn decodes_records(&self) -> bool {
        true
    }

    fn partial_since(&self) -> Option<tokio::time::Instant> {
        self.get_ref().0.since
    }

    fn handed_out(&mut self) {
        self.get_mut().0.since = None;
    }
}

impl Transport for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_is_told_from_a_wire_message() {
        assert!(is_tls_handshake(&[0x16, 0x03, 0x01]));
        assert!(is_tls_handshake(&[0x16, 0x03, 0x03]));
        // A message of 790 bytes would start 0x16 0x03 0x00 too: TLS 1.0's record version is
        // 0x0301, and no client sends SSL 3.0 (0x0300) any more; both read as TLS.
        assert!(!is_tls_handshake(&[0x16, 0x04, 0x00]));
        assert!(!is_tls_handshake(&[0xdd, 0x00, 0x00]));
        assert!(!is_tls_handshake(&[0x16]));
        assert!(!is_tls_handshake(&[]));
    }

    #[test]
    fn modes_parse_as_mongod_spells_them() {
        assert_eq!("requireTLS".parse(), Ok(TlsMode::Require));
        assert_eq!("preferTLS".parse(), Ok(TlsMode::Prefer));
        assert!("required".parse::<TlsMode>().is_err());
    }

    #[test]
    fn a_mode_without_a_certificate_is_refused() {
        let e = ServerTls::new(TlsMode::Require, &TlsFiles::default()).expect_err("no file");
        assert!(e.contains("--tlsCertificateKeyFile"));
        assert!(
            ServerTls::new(TlsMode::Disabled, &TlsFiles::default())
                .expect("disabled")
                .is_none()
        );
    }
}
