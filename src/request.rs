//! What one request carries through the gateway besides itself: who sent
//! it ([`Peer`]), the client behind that peer ([`Client`]) and what its
//! logs, trace and upstream need to know about it ([`RequestLog`]). A leaf
//! below the server, the listeners and the upstreams, which all use it.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use std::time::Duration;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request};
use ipnet::IpNet;
use tokio::time::Instant;

use crate::access::{AccessLine, UpstreamTiming};
use crate::config::AccessLogFormat;
use crate::headers::rules::{ForInterims, HeaderRules};
use crate::layers::request_id::RequestId;
use crate::layers::trace::TraceContext;
use crate::timer::KeptTimer;

/// Marks a request that a route's `auth` let in (a request extension). The
/// credentials may no longer travel in `Authorization` (Basic and JWT
/// remove it), but the answer is still one to an authenticated request: a
/// shared cache shares it only when the upstream says it may (RFC 9111
/// §3.5), as it would with `Authorization`.
#[derive(Debug, Clone, Copy)]
pub struct Authenticated;

/// 1xx heads other than 100 and 101 (103 Early Hints, 102) an upstream
/// sent before its answer, as it sent them, for the client connection to
/// forward (RFC 9110 §15.2: a proxy forwards 1xx it did not ask for). The
/// gateway's own HTTP/2 connection puts one in each request's extensions;
/// its own HTTP/1.1 connection keeps one for all its requests, made at
/// the first 1xx ([`Peer::interims`]).
#[derive(Clone, Default)]
pub struct Interims(Arc<Mutex<(VecDeque<bytes::Bytes>, Option<Waker>)>>);

impl Interims {
    /// Heads kept waiting at most: an upstream that floods them loses the
    /// rest, it does not grow the gateway.
    const MAX_WAITING: usize = 4;

    /// An interim head arrived from the upstream.
    pub fn push(&self, head: bytes::Bytes) {
        let mut inner = self.0.lock().expect("interims lock");
        if inner.0.len() < Self::MAX_WAITING {
            inner.0.push_back(head);
        }
        if let Some(w) = inner.1.take() {
            w.wake();
        }
    }

    /// The next interim head, waiting for one.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<bytes::Bytes> {
        let mut inner = self.0.lock().expect("interims lock");
        match inner.0.pop_front() {
            Some(head) => Poll::Ready(head),
            None => {
                inner.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// Forgets the task that last waited for a head (one that ended).
    pub fn forget_waiter(&self) {
        self.0.lock().expect("interims lock").1 = None;
    }

    /// The next interim head, if one is waiting.
    pub fn take(&self) -> Option<bytes::Bytes> {
        self.0.lock().expect("interims lock").0.pop_front()
    }
}

/// Where an upstream's 1xx heads for one request go, and the route's
/// response rules they are passed on under.
pub struct InterimSink<'a> {
    queue: InterimQueue<'a>,
    rules: Option<Arc<HeaderRules>>,
}

enum InterimQueue<'a> {
    /// The request's own (the gateway's own HTTP/2 connection puts one in
    /// each request's extensions).
    Request(Interims),
    /// Its client connection's, made at the first one (see
    /// [`Peer::interims`]).
    Connection(&'a OnceLock<Interims>),
}

impl<'a> InterimSink<'a> {
    /// The sink of a request that carries its own queue, else of its
    /// connection's, `connection` (if any); under the rules `req` carries
    /// ([`ForInterims`], taken out).
    pub fn of<B>(req: &mut Request<B>, connection: Option<&'a OnceLock<Interims>>) -> Option<Self> {
        let queue = match req.extensions_mut().remove::<Interims>() {
            Some(queue) => InterimQueue::Request(queue),
            None => InterimQueue::Connection(connection?),
        };
        let rules = req.extensions_mut().remove::<ForInterims>().map(|ForInterims(rules)| rules);
        Some(InterimSink { queue, rules })
    }

    /// An interim head arrived from the upstream: queued, without the
    /// fields the route's rules name.
    pub fn push(&self, head: bytes::Bytes) {
        let head = match &self.rules {
            None => head,
            Some(rules) => match crate::headers::interim::without(&head, rules) {
                Some(head) => head,
                None => return,
            },
        };
        match &self.queue {
            InterimQueue::Request(queue) => queue.push(head),
            InterimQueue::Connection(queue) => queue.get_or_init(Interims::default).push(head),
        }
    }
}

/// Who is on the other end of a client connection.
pub struct Peer {
    /// The client's IP (IPv4-mapped IPv6 as plain IPv4).
    pub ip: IpAddr,
    /// The client's IP as an `X-Forwarded-For` item, formatted once per
    /// connection.
    pub forwarded_for: HeaderValue,
    /// The client is a trusted proxy (`server.trusted_proxies`).
    pub trusted: bool,
    /// The client connected over TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// The connection may forward an upstream's 1xx (the gateway's own
    /// HTTP/1.1 connection may be serving it): only then is a request's
    /// [`Interims`] looked for, a lookup hyper's connections would pay for
    /// every request in vain (see benches/README.md, Decisions).
    pub forwards_1xx: bool,
    /// Set by the gateway's own HTTP/1.1 connection at its first HTTP/1.1
    /// request: the mark that its requests' 1xx go to [`Peer::interims`]
    /// and that it runs a 101's tunnel itself. Kept here, not put in each
    /// request's extensions: the extension map cost every request four
    /// allocations (see benches/README.md, Decisions).
    pub own_h1: AtomicBool,
    /// The own HTTP/1.1 connection's 1xx queue, one request at a time,
    /// made at the first 1xx an upstream sends it: most connections never
    /// see one, and an idle connection keeps nothing for it. (The upstream
    /// reads its 1xx in the request's future, which the connection's task
    /// polls before it looks here: one made meanwhile is seen at once.)
    pub interims: OnceLock<Interims>,
    /// The timer for its requests' route deadlines, kept between them (see
    /// [`crate::timer`]).
    pub timer: KeptTimer,
}

impl Peer {
    pub fn new(ip: IpAddr, trusted: bool, tls: bool) -> Self {
        let forwarded_for = crate::headers::forwarded_for(ip);
        let (own_h1, interims) = (AtomicBool::new(false), OnceLock::new());
        let timer = KeptTimer::default();
        Peer { ip, forwarded_for, trusted, tls, forwards_1xx: false, own_h1, interims, timer }
    }

    /// Whether the gateway's own HTTP/1.1 connection serves it (see
    /// [`Peer::own_h1`]).
    pub fn own_h1(&self) -> bool {
        self.own_h1.load(Relaxed)
    }

    /// Where its requests' 1xx go, if its connection is the own HTTP/1.1
    /// one.
    pub fn connection_interims(&self) -> Option<&OnceLock<Interims>> {
        self.own_h1().then_some(&self.interims)
    }

    /// With [`Peer::forwards_1xx`] set to `yes`.
    pub fn forwarding_1xx(self, yes: bool) -> Self {
        Peer { forwards_1xx: yes, ..self }
    }
}

/// Who a request is from, by address: the connection's peer or, when the
/// peer is a trusted proxy (`server.trusted_proxies`), the right-most
/// `X-Forwarded-For` address that is not itself trusted. Only trusted
/// proxies append to the list, so that address is the first one a client
/// could not have chosen (an address a client puts in its own
/// `X-Forwarded-For` sits left of it and is never read). Decided by
/// [`Peer::client`] alone, for a route's `allow`/`deny` and its rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// The client's address (IPv4-mapped IPv6 as plain IPv4).
    Addr(IpAddr),
    /// A trusted proxy sent an item that is not an address, so nothing left
    /// of it can be believed: the last address that could (a trusted one).
    Broken(IpAddr),
}

impl Client {
    /// The address, `None` for a broken chain: what address lists admit,
    /// so that a broken chain is refused rather than read as a proxy.
    pub fn addr(self) -> Option<IpAddr> {
        match self {
            Client::Addr(ip) => Some(ip),
            Client::Broken(_) => None,
        }
    }

    /// The address, or for a broken chain the last address believed: what
    /// a rate limit counts (such requests share their proxy's bucket).
    pub fn believed(self) -> IpAddr {
        match self {
            Client::Addr(ip) | Client::Broken(ip) => ip,
        }
    }
}

impl Peer {
    /// The client of a request from this peer with `headers` (see
    /// [`Client`]). The list is read from the right across every
    /// `X-Forwarded-For` line; empty elements are skipped (RFC 9110
    /// §5.6.1); when every address is a trusted proxy, the left-most is the
    /// client.
    pub fn client(&self, headers: &HeaderMap, trusted: &[IpNet]) -> Client {
        let mut client = self.ip.to_canonical();
        if !self.trusted {
            return Client::Addr(client);
        }
        for value in headers.get_all(crate::headers::X_FORWARDED_FOR).iter().rev() {
            let Ok(text) = value.to_str() else { return Client::Broken(client) };
            for item in text.rsplit(',').map(str::trim).filter(|i| !i.is_empty()) {
                let Some(ip) = parse_forwarded_item(item) else { return Client::Broken(client) };
                if !trusted.iter().any(|n| n.contains(&ip)) {
                    return Client::Addr(ip);
                }
                client = ip;
            }
        }
        Client::Addr(client)
    }
}

/// An `X-Forwarded-For` item: an address, possibly with a port, as some
/// proxies write them (`1.2.3.4:5`, `[::1]:5`); IPv4-mapped IPv6 as plain
/// IPv4, so that one client has one address whichever way it was written.
fn parse_forwarded_item(item: &str) -> Option<IpAddr> {
    let ip = item.parse::<IpAddr>().ok().or_else(|| item.parse::<SocketAddr>().ok().map(|s| s.ip()))?;
    Some(ip.to_canonical())
}

/// What the upstream and the logs of one request need to know about it.
pub struct RequestLog<'a> {
    /// Its ID, when request IDs are on.
    pub id: Option<&'a RequestId>,
    /// Its trace, when trace context is on or spans are exported.
    pub trace: Option<TraceContext>,
    /// Whether the upstream gets the trace (trace context is on).
    pub propagate_trace: bool,
    /// What the proxy learns of the upstream, when the access log is on.
    pub timing: Option<Arc<UpstreamTiming>>,
    /// The access log line, when the access log is on.
    pub(crate) access: Option<Box<AccessLine>>,
    /// What the exported span needs, when spans are exported.
    pub(crate) span: Option<Box<SpanStart>>,
    recording: Recording,
}

/// What is recorded of every request besides its metrics: chosen once, from
/// the configuration, when the application is built.
#[derive(Debug, Clone, Copy)]
pub struct Recording {
    /// W3C trace context is continued and passed on (`server.trace_context`).
    pub trace_context: bool,
    /// Spans are exported (`[tracing] otlp_endpoint`).
    pub spans: bool,
    /// The access log's format, when it is on (`server.access_log`).
    pub access: Option<AccessLogFormat>,
}

/// The parts of a request its span needs, taken at its start.
pub(crate) struct SpanStart {
    pub(crate) path: String,
    pub(crate) host: Option<String>,
    pub(crate) client: String,
}

impl<'a> RequestLog<'a> {
    /// A request as it arrived. Its trace (continued when trace context is
    /// on, else a new one when spans are exported) is read as the client sent
    /// it, before hop-by-hop stripping and the route's header rules, when a
    /// span or the access log shows it; when only a proxied request would
    /// use it, it is left to [`RequestLog::route_found`].
    pub(crate) fn new(req: &Request<Incoming>, id: Option<&'a RequestId>, recording: Recording) -> Self {
        let Recording { trace_context, spans, access } = recording;
        let trace = if trace_context && (spans || access.is_some()) {
            Some(TraceContext::from_headers(req.headers()))
        } else {
            spans.then(TraceContext::root)
        };
        RequestLog { id, trace, propagate_trace: trace_context, timing: None, access: None, span: None, recording }
    }

    /// What the span and the access log keep of the request (its path as
    /// normalised), when they are on.
    pub(crate) fn describe(&mut self, req: &Request<Incoming>, peer: &Peer, start: Instant) {
        if self.recording.spans {
            let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_owned);
            let host = host.or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
            let path = req.uri().path().to_owned();
            let client = peer.forwarded_for.to_str().unwrap_or("-").to_owned();
            self.span = Some(Box::new(SpanStart { path, host, client }));
        }
        if let Some(format) = self.recording.access {
            self.timing = Some(Arc::default());
            self.access = Some(self.access_line(format, req, peer, start));
        }
    }

    /// The route is known: a request that will be proxied gets the trace it
    /// passes on, if it has none yet. Other routes skip it when nothing
    /// else shows it, to save its cost on every request (see
    /// benches/README.md, Decisions). The route's header rules and auth
    /// have not run yet (and neither may set the trace fields), so the
    /// trace is still the one the client sent.
    pub(crate) fn route_found(&mut self, req: &Request<Incoming>, proxied: bool) {
        if proxied && self.propagate_trace && self.trace.is_none() {
            self.trace = Some(TraceContext::from_headers(req.headers()));
        }
    }

    /// The access log line of a request, all but what its outcome tells.
    fn access_line(
        &self,
        format: AccessLogFormat,
        req: &Request<Incoming>,
        peer: &Peer,
        start: Instant,
    ) -> Box<AccessLine> {
        // Its bytes, not `to_str`: a value with bytes beyond ASCII is logged
        // (escaped as it came), not dropped.
        let header = |name| req.headers().get(name).map(|v: &HeaderValue| crate::access::kept(v.as_bytes()).to_vec());
        // A token in a query (`?access_token=`) is not logged: its value is
        // redacted as `/-/config` redacts one, in the target and `Referer`.
        let path = crate::config::redact_url(req.uri().path_and_query().map_or("/", |pq| pq.as_str()));
        let referer = header(header::REFERER).map(|r| match std::str::from_utf8(&r) {
            Ok(text) => crate::config::redact_url(text).into_bytes(),
            // Bytes past UTF-8 are kept as sent, unless there is a token to
            // redact: then the line says it without them.
            Err(_) => {
                let lossy = String::from_utf8_lossy(&r);
                let redacted = crate::config::redact_url(&lossy);
                if redacted == lossy { r } else { redacted.into_bytes() }
            }
        });
        Box::new(AccessLine {
            format,
            time: std::time::SystemTime::now(),
            client: peer.forwarded_for.to_str().unwrap_or("-").to_owned(),
            method: req.method().clone(),
            // Cut on a character boundary: a target may hold UTF-8.
            path: path[..path.floor_char_boundary(crate::access::MAX_VALUE)].to_owned(),
            version: req.version(),
            route: String::new(),
            status: 0,
            upstream: None,
            request_id: self.id.map(|id| id.as_str().to_owned()),
            trace_id: self.trace.map(|t| t.trace_id_hex()),
            user_agent: header(header::USER_AGENT),
            referer,
            user: None,
            duration: Duration::ZERO,
            timing: self.timing.clone(),
            bytes_out: 0,
            started: start,
        })
    }

    /// What a request made on this one's behalf but outliving it (a cache
    /// fill, a background refresh) passes on: its trace and what its access
    /// line learns of the upstream, none of the rest of its logging (the
    /// request's ID travels in its headers).
    pub fn detached(&self) -> RequestLog<'static> {
        RequestLog {
            id: None,
            trace: self.trace,
            propagate_trace: self.propagate_trace,
            timing: self.timing.clone(),
            access: None,
            span: None,
            recording: self.recording,
        }
    }

    /// The authenticated user, for the access log (when it is on).
    pub(crate) fn set_user(&mut self, user: Option<std::sync::Arc<str>>) {
        if let (Some(line), Some(user)) = (self.access.as_mut(), user) {
            line.user = Some(user);
        }
    }

    /// The request ID for a log line (`-` without one).
    pub fn request_id(&self) -> &str {
        self.id.map_or("-", RequestId::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_the_right_most_untrusted_forwarded_address() {
        let trusted: Vec<IpNet> =
            ["127.0.0.1/32", "10.0.0.0/8", "::1/128"].iter().map(|n| n.parse().unwrap()).collect();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let (addr, broken) = (|s: &str| Client::Addr(ip(s)), |s: &str| Client::Broken(ip(s)));
        // (peer, peer trusted, X-Forwarded-For lines, client)
        let cases: Vec<(&str, bool, Vec<&str>, Client)> = vec![
            // An untrusted peer is itself, whatever it claims.
            ("203.0.113.9", false, vec!["198.51.100.1"], addr("203.0.113.9")),
            ("::ffff:203.0.113.9", false, vec![], addr("203.0.113.9")),
            // A trusted peer without the header: the peer.
            ("127.0.0.1", true, vec![], addr("127.0.0.1")),
            ("::ffff:127.0.0.1", true, vec![], addr("127.0.0.1")),
            // The right-most address that is not a proxy, across lines.
            ("127.0.0.1", true, vec!["192.0.2.1"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec!["198.51.100.9, 192.0.2.1, 10.1.1.1"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec!["198.51.100.9", "192.0.2.1, 10.1.1.1"], addr("192.0.2.1")),
            ("::1", true, vec!["2001:db8::2"], addr("2001:db8::2")),
            // Every entry a proxy: the left-most one.
            ("127.0.0.1", true, vec!["10.2.2.2, 10.1.1.1"], addr("10.2.2.2")),
            // Empty elements are no items (RFC 9110 §5.6.1).
            ("127.0.0.1", true, vec!["192.0.2.1,"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec!["192.0.2.1, , 10.1.1.1"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec![","], addr("127.0.0.1")),
            // Ports, brackets and IPv4-mapped IPv6, as some proxies write them.
            ("127.0.0.1", true, vec!["192.0.2.1:4711"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec!["[2001:db8::1]:80"], addr("2001:db8::1")),
            ("127.0.0.1", true, vec!["::ffff:192.0.2.1"], addr("192.0.2.1")),
            ("127.0.0.1", true, vec!["::ffff:10.1.1.1, 10.2.2.2"], addr("10.1.1.1")),
            // Garbage ends the walk: broken, at the last address believed.
            ("127.0.0.1", true, vec!["garbage"], broken("127.0.0.1")),
            ("127.0.0.1", true, vec!["garbage, 10.1.1.1"], broken("10.1.1.1")),
            ("127.0.0.1", true, vec!["192.0.2.1, garbage"], broken("127.0.0.1")),
            // Garbage left of the client is never read.
            ("127.0.0.1", true, vec!["garbage, 192.0.2.1"], addr("192.0.2.1")),
        ];
        for (peer, peer_trusted, lines, want) in cases {
            let mut headers = HeaderMap::new();
            for line in &lines {
                headers.append(crate::headers::X_FORWARDED_FOR, line.parse().unwrap());
            }
            let got = Peer::new(ip(peer), peer_trusted, false).client(&headers, &trusted);
            assert_eq!(got, want, "{peer} {peer_trusted} {lines:?}");
        }
        let mut opaque = HeaderMap::new();
        opaque.insert(crate::headers::X_FORWARDED_FOR, HeaderValue::from_bytes(b"192.0.2.1, \xff").unwrap());
        let got = Peer::new(ip("127.0.0.1"), true, false).client(&opaque, &trusted);
        assert_eq!(got, broken("127.0.0.1"), "a value that is not text is broken");
        assert_eq!((broken("10.1.1.1").addr(), broken("10.1.1.1").believed()), (None, ip("10.1.1.1")));
        assert_eq!(addr("192.0.2.1").addr(), Some(ip("192.0.2.1")));
    }
}
