//! Opening a connection to one endpoint: TCP (with TLS for `https://`) or
//! a Unix socket, bounded by the connect timeout, and the socket type the
//! pool's connections run over.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config::{Address, EndpointConfig, UpstreamConfig};

/// Why a new connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(#[from] hyper::Error),
    /// The TLS handshake failed (certificate, protocol, refused).
    #[error("TLS: {}", crate::tls::describe_failure(.0))]
    Tls(std::io::Error),
}

/// How an `https://` endpoint's connections are secured.
#[derive(Clone)]
pub struct TlsTarget {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl TlsTarget {
    /// The endpoint's TLS settings, if it is an `https://` one.
    pub fn new(endpoint: &EndpointConfig, config: &UpstreamConfig) -> Option<TlsTarget> {
        let client = config.tls.as_ref()?.config.clone();
        let name = endpoint.tls_name.clone()?;
        Some(TlsTarget { connector: TlsConnector::from(client), name })
    }
}

/// Opens a socket to `address` and, for an `https://` endpoint, completes
/// the TLS handshake, all within `timeout`.
pub async fn connect_stream(
    address: &Address,
    tls: Option<&TlsTarget>,
    timeout: Duration,
) -> Result<Stream, ConnectError> {
    let connect = async {
        match address {
            Address::Ip(addr) => secure(TcpStream::connect(*addr).await?, tls).await,
            Address::Tcp(host_port) => secure(TcpStream::connect(host_port.as_str()).await?, tls).await,
            Address::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).await?)),
        }
    };
    tokio::time::timeout(timeout, connect).await.map_err(|_| ConnectError::Timeout(timeout))?
}

/// A new TCP connection, with TLS over it for an `https://` endpoint.
async fn secure(stream: TcpStream, tls: Option<&TlsTarget>) -> Result<Stream, ConnectError> {
    stream.set_nodelay(true)?;
    match tls {
        None => Ok(Stream::Tcp(stream)),
        Some(t) => {
            let secured = t.connector.connect(t.name.clone(), stream).await.map_err(ConnectError::Tls)?;
            Ok(Stream::Tls(Box::new(secured)))
        }
    }
}

/// An upstream socket: TCP, TLS over TCP, or Unix.
pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl Stream {
    /// The TLS handshake chose HTTP/2 by ALPN.
    pub fn alpn_h2(&self) -> bool {
        matches!(self, Stream::Tls(s) if s.get_ref().1.alpn_protocol() == Some(b"h2"))
    }

    /// The TCP socket under it, if there is one.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Tls(s) => Some(s.get_ref().0),
            Stream::Unix(_) => None,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
