//! The Pingora peer of `benches/compare`: a plain HTTP/1.1 reverse proxy on
//! Cloudflare's Pingora (pingora-proxy and pingora-core from crates.io,
//! without TLS), configured as the nginx, HAProxy, Caddy and Traefik peers
//! are. One worker thread (`threads: 1`), no access log, an idle pool to
//! service A of `--pool` connections (`upstream_keepalive_pool_size`),
//! nginx's timeouts to A (connect 1 s, read 2 s); `GET /b` goes to the
//! upstream with its path replaced by the upstream URL's (the query kept),
//! as nginx's `proxy_pass`, HAProxy's `set-path`, Caddy's `rewrite` and
//! Traefik's `replacePath` do; any other path is answered 404.
//!
//! ```sh
//! cargo build --release --manifest-path benches/peers/pingora/Cargo.toml --target-dir target/pingora
//! target/pingora/release/pingora-peer --listen 127.0.0.1:8080 \
//!     --upstream http://127.0.0.1:9000/hello --pool 2048
//! ```

use std::net::SocketAddr;
use std::process::exit;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

/// The command line: `--listen ADDR --upstream http://HOST:PORT/PATH [--pool N]`.
struct Args {
    listen: String,
    upstream: SocketAddr,
    path: String,
    pool: usize,
}

fn usage(why: &str) -> ! {
    eprintln!("pingora-peer: {why}");
    eprintln!("usage: pingora-peer --listen 127.0.0.1:PORT --upstream http://127.0.0.1:PORT/PATH [--pool N]");
    exit(2)
}

fn parse_args() -> Args {
    let (mut listen, mut upstream, mut pool) = (None, None, 128);
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let Some(value) = argv.next() else { usage(&format!("{flag} needs a value")) };
        match flag.as_str() {
            "--listen" => listen = Some(value),
            "--upstream" => upstream = Some(value),
            "--pool" => pool = value.parse().unwrap_or_else(|_| usage("--pool needs a number")),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    let listen = listen.unwrap_or_else(|| usage("--listen is needed"));
    let url = upstream.unwrap_or_else(|| usage("--upstream is needed"));
    let rest = url.strip_prefix("http://").unwrap_or_else(|| usage("--upstream must be an http:// URL"));
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let upstream = host.parse().unwrap_or_else(|_| usage("--upstream needs an IP address and port"));
    let path = if path.is_empty() { "/".to_string() } else { path.to_string() };
    Args { listen, upstream, path, pool }
}

struct Peer {
    upstream: HttpPeer,
    path: String,
}

#[async_trait]
impl ProxyHttp for Peer {
    type CTX = ();

    fn new_ctx(&self) {}

    /// Only `/b` is proxied, as the other peers' configs do.
    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if session.req_header().uri.path() == "/b" {
            return Ok(false);
        }
        session.respond_error(404).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.upstream.clone()))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        request: &mut RequestHeader,
        _ctx: &mut (),
    ) -> Result<()> {
        let target = match request.uri.query() {
            Some(query) => format!("{}?{query}", self.path),
            None => self.path.clone(),
        };
        request.set_raw_path(target.as_bytes())
    }

    /// Errors only (a failed or timed-out upstream request), to stderr.
    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut ()) {
        if let Some(error) = error {
            eprintln!("{}: {error}", self.request_summary(session, ctx));
        }
    }
}

fn main() {
    let args = parse_args();
    let conf = ServerConf {
        threads: 1,
        upstream_keepalive_pool_size: args.pool,
        // SIGTERM stops it at once: the default waits 5 minutes for
        // connections to finish, and benches/compare waits 3 s.
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut upstream = HttpPeer::new(args.upstream, false, String::new());
    upstream.options.connection_timeout = Some(Duration::from_secs(1));
    upstream.options.read_timeout = Some(Duration::from_secs(2));
    let peer = Peer { upstream, path: args.path };
    let mut proxy = http_proxy_service(&server.configuration, peer);
    proxy.add_tcp(&args.listen);
    server.add_service(proxy);
    server.run_forever();
}
