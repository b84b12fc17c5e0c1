//! A floor for `benches/compare`, `benches/callgrind` and `benches/memory`:
//! the least a keep-alive HTTP/1.1 proxy built like the gateway (hyper's
//! server and connection-level client, a spawned task per upstream
//! connection, hyper's default buffers) costs per request and per
//! connection, with none of the gateway's work
//! (no routing beyond one prefix, no header rules, forwarding headers,
//! request IDs, limits, timeouts, metrics or logs). It is not a product,
//! and it skips work any correct proxy must do: it forwards the client's
//! head as it came (hop-by-hop headers included), sets no timeouts,
//! answers no upstream failure with a 502 (hyper drops the connection),
//! and never resends on a stale connection.
//!
//! It reads the same config file the scripts write for the gateway:
//! `server.listen`, the first upstream's `url`, and the first proxy
//! route's `rewrite`; every request goes to that upstream with that path.
//!
//! ```sh
//! cargo build --release
//! cargo build --release --manifest-path benches/floor/Cargo.toml --target-dir target/floor
//! GATEWAY_BIN=target/floor/release/hyper-floor \
//!     UPSTREAM_BIN=target/release/gateway benches/callgrind /b 10000
//! ```
//!
//! Like the gateway, it keeps idle upstream connections in a
//! last-in-first-out stack and returns one when its response body ends.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Idle = Arc<Mutex<Vec<SendRequest<Incoming>>>>;

/// The upstream's body; gives the connection back when it ends.
struct Pooled {
    body: Incoming,
    conn: Option<(SendRequest<Incoming>, Idle)>,
}

impl Body for Pooled {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// hyper's server stops polling a body whose size hint says it is complete,
/// so the end is also noticed when the body is dropped.
impl Drop for Pooled {
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.release();
        }
    }
}

impl Pooled {
    fn release(&mut self) {
        if let Some((sender, idle)) = self.conn.take() {
            idle.lock().expect("pool").push(sender);
        }
    }
}

struct Upstream {
    address: String,
    path: Uri,
    idle: Idle,
}

impl Upstream {
    async fn forward(&self, mut req: Request<Incoming>) -> Result<Response<Pooled>, hyper::Error> {
        let popped = self.idle.lock().expect("pool").pop();
        let mut sender = match popped {
            Some(s) if !s.is_closed() => s,
            _ => {
                let stream = TcpStream::connect(&self.address).await.expect("connect upstream");
                stream.set_nodelay(true).expect("nodelay");
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                sender
            }
        };
        sender.ready().await?;
        *req.uri_mut() = self.path.clone();
        let response = sender.send_request(req).await?;
        let (parts, body) = response.into_parts();
        Ok(Response::from_parts(parts, Pooled { body, conn: Some((sender, self.idle.clone())) }))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = match &args[1..] {
        [flag, path] if flag == "--config" => path.clone(),
        _ => panic!("usage: hyper-floor --config FILE"),
    };
    let text = std::fs::read_to_string(&path).expect("read the config file");
    let cfg: toml::Table = text.parse().expect("TOML");
    let str_at = |v: &toml::Value, key: &str| v.get(key).and_then(toml::Value::as_str).map(str::to_owned);
    let listen = cfg.get("server").and_then(|s| str_at(s, "listen")).expect("server.listen");
    let upstreams = cfg.get("upstreams").and_then(toml::Value::as_table).expect("upstreams");
    let url = upstreams.values().next().and_then(|u| str_at(u, "url")).expect("an upstream url");
    let routes = cfg.get("routes").and_then(toml::Value::as_array).expect("routes");
    let rewrite = routes
        .iter()
        .find(|r| r.get("upstream").is_some())
        .and_then(|r| str_at(r, "rewrite"))
        .unwrap_or_else(|| "/".into());
    let upstream = Arc::new(Upstream {
        address: url.trim_start_matches("http://").to_string(),
        path: rewrite.parse().expect("path"),
        idle: Arc::default(),
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(&listen).await.expect("bind");
        let accept = async {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let _ = stream.set_nodelay(true);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let upstream = upstream.clone();
                        async move { upstream.forward(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
}
