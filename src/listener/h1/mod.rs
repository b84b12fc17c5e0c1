//! The gateway's own client-facing HTTP/1.1 connection (`server.http1 =
//! "gateway"`), in place of hyper's server connection; HTTP/2, chosen as
//! before by the connection preface or ALPN, is served as `server.http2`
//! says.
//!
//! Why: hyper's server keeps two 8 KiB buffers for every connection's
//! whole life, idle or not, and a task-sized future per connection. Here a
//! connection waiting for its next request holds its socket and a few
//! words: the read buffer is dropped whenever it holds nothing (reads go
//! through a buffer on the stack until bytes arrive), and response bytes
//! are encoded per response.
//!
//! How its parts fit: `head` parses a request head with `httparse` into
//! `http::request::Parts` and decides the body's framing; `wire` holds the
//! socket and the bytes read, shared with the request body in flight,
//! which decodes itself (the upstream client's decoder, `Expect:
//! 100-continue` answered when the body is first asked for); `encode`
//! writes the response head and the body's framing, and `respond` the
//! response with them; `slot` keeps the boxes the app's futures run in;
//! this file runs one exchange after the other, and `guard` runs them
//! beside the connection's watchdog and shutdown signals, as hyper's
//! connection runs in `listener`; `park` lets a connection idle for a
//! while give its task up until its next request; `linger` reads and drops
//! what a client still sends after an answer that closed the connection.
//!
//! Where it decides differently from hyper's server connection:
//! - A TLS connection without ALPN goes to hyper-util's `auto` connection
//!   as before (it may be HTTP/2 with prior knowledge), so it is served by
//!   hyper whatever `server.http1` says.
//! - A response body that fails mid-way has the bytes buffered before the
//!   failure written before the connection is closed (hyper drops them).
//! - A graceful shutdown closes a connection at once only while nothing
//!   of its next request has come: a head begun is served (with
//!   `Connection: close`), where hyper's serves only a connection's first.
//! - A request cut off by the shutdown timeout (or a second signal) before
//!   anything of its answer was written gets the 503 the log records;
//!   hyper's connection is closed with no answer.
//! - The first bytes of a next head read behind a request's body are
//!   timed by the header read timeout from the request's answer (hyper's
//!   cannot be told from the body, and the idle timeout bounds them).
//! - A request body's framing error reads "invalid response body" in the
//!   gateway's log (the decoder is the upstream client's), and a chunk-size
//!   line past that decoder's bound (thousands of leading zeros) is a 400
//!   where hyper's takes it.
//! - A connection answered before its request body was read closes with
//!   a lingering close (see `linger`); hyper's closes at once, and the
//!   client's unread bytes reset the connection.
//! - A refused head's 400, 414 or 431 carries an `X-Request-Id` (the head's
//!   own when it was read whole and may be kept, else one made here);
//!   hyper's carries none.

mod encode;
mod guard;
mod head;
mod linger;
mod park;
mod replay;
mod respond;
mod slot;
mod wire;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method, Request, Response, Version, request};

use super::conn::{ConnBody, ConnState};
use super::{Connection, Held, Kind};
use crate::body::Incoming;
use crate::layers::request_id::RequestId;
use crate::metrics;
use crate::request::Interims;
use crate::server::App;
use crate::upstream::h1::Framing as DecodeFraming;
use crate::upstream::h1::decode::Decoder;
use crate::upstream::tunnel::Tunnel;
pub(super) use encode::with_date;
use encode::{Asked, BodyLength};
use guard::{Flags, Signals, guard, switch};
use head::{Framing, Meta, Refused};
pub(super) use park::{Listener, Parking};
pub use replay::replay;
pub use wire::ClientStream;
use wire::{Shared, WireBody};

/// Response bytes gathered before a write: the head with a small body
/// goes in one.
const COALESCE: usize = 16 * 1024;
// The write buffers kept per thread are those of this size at most.
const _: () = assert!(COALESCE == crate::net::KEPT_MAX);

/// What a wait for the answer found.
enum Waited {
    /// The answer, put where the caller keeps it (see `wait_for_answer`).
    Answer,
    /// A 1xx head from the upstream.
    Interim(Bytes),
    /// The client closed its side (`true`) or sent more.
    Watched(std::io::Result<bool>),
}

/// Why a wait ended other than by what was awaited.
enum Stop {
    /// Close the connection: idle, or shutting down while idle.
    Close,
    /// Cut it at once (a timeout, the shutdown timeout).
    Cut,
    /// Idle long enough to give the task up (see [`park`]).
    Park,
}

/// One client connection served by the gateway's own HTTP/1.1 code: its
/// exchanges, which [`guard`] runs beside the watchdog and the shutdown
/// signals.
struct Own<'a> {
    wire: &'a Shared,
    app: &'a Arc<App>,
    kind: Kind,
    state: &'a Arc<ConnState>,
    addr: &'a std::net::SocketAddr,
    /// The bytes a request head may take.
    max_head: usize,
    flags: &'a Flags,
    /// Whether an idle wait may end in a park: a plain-TCP connection
    /// whose task holds its slot, while no shutdown has begun.
    parks: bool,
    /// Its listener's, which looks at it while it may park.
    parking: &'a Arc<Parking>,
}

/// How the exchanges on a connection ended.
enum Ended {
    Stop(Stop),
    /// After a 101: the tunnel to run over the socket.
    /// (Boxed: held where the connection closes, it would make every
    /// connection's task larger.)
    Switch(Box<Tunnel>),
}

/// Serves requests on `io`, whose bytes `first` were read already, until
/// the connection closes (then runs its tunnel if it switched protocols)
/// or parks, taking `held` with it.
pub(super) fn serve<'a>(
    io: ClientStream,
    first: BytesMut,
    c: &'a mut Connection,
    held: &'a mut Option<Held>,
) -> impl Future<Output = ()> + Send + 'a {
    let wire = Shared::new(io, first);
    let parks = may_park(&wire, c, held);
    if parks {
        c.stops.parking.watch(&c.state);
    }
    serve_wire(wire, c, held, parks)
}

/// Whether the connection may park when idle: a plain-TCP one on the main
/// listener whose task holds its slot (see [`park`]).
fn may_park(wire: &Shared, c: &Connection, held: &Option<Held>) -> bool {
    held.is_some()
        && c.kind == Kind::Main
        && c.stops.parking.parks()
        && matches!(wire.lock().io, ClientStream::Plain(_))
}

/// [`serve`]'s future, which an idle connection's task holds: between
/// requests it waits for the next one's first bytes, and only then makes
/// the future that reads the head and runs the exchange (boxed, and
/// dropped when the connection is idle again), so that an idle connection
/// keeps no room for a request's state. `parks`: whether an idle wait
/// may end in a park (see [`may_park`]).
async fn serve_wire(wire: Shared, c: &mut Connection, held: &mut Option<Held>, parks: bool) {
    let Connection { builders: _, addr, app, kind, stops, state, watchdog } = c;
    let stops = &*stops;
    let flags = Flags::default();
    let stop = pin!(stops.graceful.cancelled());
    let mut signals = Signals { watchdog, stops, stop, stop_polled: false, flags: &flags, addr };
    let max_head = app.config().server.max_header_size as usize;
    let parking = &stops.parking;
    let mut own = Own { wire: &wire, app, kind: *kind, state, addr, max_head, flags: &flags, parks, parking };
    let ended = loop {
        let idled = guard(pin!(own.idle()), &mut signals).await;
        match idled {
            Ok(Ok(())) => {}
            Ok(Err(Stop::Park)) => {
                if park::park(&own, signals.stops, held) {
                    return;
                }
                // Readable already, or shutting down (then none parks
                // from here on): back to the idle wait, which reads what
                // came or, shutting down, closes.
                own.parks = !signals.stops.said.graceful();
                continue;
            }
            Ok(Err(stop)) | Err(stop) => break Err(stop),
        }
        let mut busy = Box::pin(own.busy());
        match guard(busy.as_mut(), &mut signals).await {
            Ok(None) => {}
            Ok(Some(ended)) => break Ok(ended),
            Err(stop) => break Err(stop),
        }
    };
    own.state.set_busy();
    let ended = match ended {
        Ok(ended) => ended,
        // Cut inside an exchange whose answer switched protocols: the
        // tunnel runs all the same.
        Err(stop) => own.state.take_tunnel().map_or(Ended::Stop(stop), Ended::Switch),
    };
    match ended {
        // Boxed: a tunnel's future is several KiB, and every connection's
        // task would reserve that space for it.
        Ended::Switch(tunnel) => {
            let timeouts = signals.watchdog.timeouts();
            Box::pin(switch(wire, tunnel, signals.stops.clone(), timeouts)).await
        }
        // A plain connection whose client closed its side, every byte of it
        // read: the socket's close sends the FIN after what is still to
        // send, as a `shutdown` would, one system call fewer.
        Ended::Stop(Stop::Close) if wire.lock().client_closed_plain() => {}
        // A clean close (a TLS close_notify, a FIN), lingering while the
        // client may still be sending its request body. Boxed: every
        // connection's task would otherwise keep room for it.
        Ended::Stop(Stop::Close) => Box::pin(linger::close(&wire, &mut signals)).await,
        // Cut by the shutdown timeout (or a second signal) while a request
        // waited for its answer: the client is told so (logged and counted
        // as this 503 by `App::abandon_requests`), not left with a closed
        // connection and no answer.
        Ended::Stop(Stop::Cut)
            if own.flags.unanswered.load(Relaxed)
                && signals.stops.said.now()
                && !wire.lock().continue_half_written() =>
        {
            let written = own.last_head(http::StatusCode::SERVICE_UNAVAILABLE, None);
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), written).await;
        }
        // (A park comes only out of an idle wait, handled above.)
        Ended::Stop(Stop::Cut | Stop::Park) => {}
    }
}

impl<'a> Own<'a> {
    /// Waits for the next request's first bytes, holding no buffer; the
    /// end of the stream (or an error) closes the connection.
    async fn idle(&self) -> Result<(), Stop> {
        if self.flags.closing() {
            return Err(Stop::Close);
        }
        if !self.wire.lock().rx.is_empty() {
            return Ok(());
        }
        let (wire, state, parks) = (self.wire, self.state, self.parks);
        // `None`: asked to park (looked at only once the read waits).
        let read = std::future::poll_fn(|cx| match wire.lock().poll_fill(cx) {
            Poll::Pending if parks && state.asked_to_park(cx) => Poll::Ready(None),
            polled => polled.map(Some),
        });
        self.flags.idle.store(true, Relaxed);
        if parks && state.set_idle() {
            self.parking.watch(state);
        }
        let read = read.await;
        if parks {
            state.set_busy();
        }
        self.flags.idle.store(false, Relaxed);
        match read {
            None => Err(Stop::Park),
            Some(Ok(0) | Err(_)) => Err(Stop::Close),
            Some(Ok(_)) => Ok(()),
        }
    }

    /// One exchange after the other while requests are there to read;
    /// `None` once the connection waits for its next one with nothing read,
    /// else how the connection ends.
    async fn busy(&mut self) -> Option<Ended> {
        loop {
            // The head's parts kept here, read into and taken from in
            // place (see `head::parse_into`), and only until the exchange
            // begins: kept beside it, they made the box of this future
            // larger than the allocator's per-thread cache takes.
            let exchange = {
                let mut parts = None;
                let meta = match self.next_head(&mut parts).await {
                    Ok(meta) => meta,
                    Err(stop) => return Some(Ended::Stop(stop)),
                };
                self.exchange(meta, &mut parts)
            };
            let again = exchange.await;
            if let Some(tunnel) = self.state.take_tunnel() {
                return Some(Ended::Switch(tunnel));
            }
            match again {
                Ok(true) if self.wire.lock().release_buffer() => return None,
                Ok(true) => {
                    self.state.head_waiting();
                    continue;
                }
                Ok(false) => return Some(Ended::Stop(Stop::Close)),
                Err(stop) => return Some(Ended::Stop(stop)),
            }
        }
    }

    /// Waits for the rest of the next request head (its first bytes are
    /// in); a close inside a head, as hyper treats it, is [`Stop::Close`],
    /// and a head that cannot be taken is answered here.
    async fn next_head(&mut self, parts: &mut Option<request::Parts>) -> Result<Meta, Stop> {
        if self.flags.closing() {
            return Err(Stop::Close);
        }
        let (wire, max) = (self.wire, self.max_head);
        // Parsed at the first bytes (which may be refused at once, as
        // hyper's are), then again only once a line has ended since the
        // last parse (or the head is as long as it may be): a head
        // trickling in byte by byte costs a parse per line, not one per read.
        let mut scanned = 0;
        let read = std::future::poll_fn(move |cx| {
            let mut w = wire.lock();
            loop {
                let first = scanned == 0 && !w.rx.is_empty();
                let ended = memchr::memchr(b'\n', &w.rx[scanned..]).is_some();
                scanned = w.rx.len();
                if first || ended || w.rx.len() >= max {
                    match head::parse_into(&mut w.rx, max, parts) {
                        Ok(Some(meta)) => return Poll::Ready(Some(Ok(meta))),
                        Ok(None) => {}
                        Err(refused) => return Poll::Ready(Some(Err(refused))),
                    }
                }
                match std::task::ready!(w.poll_fill(cx)) {
                    Ok(0) | Err(_) => return Poll::Ready(None),
                    Ok(_) => {}
                }
            }
        });
        // Not idle meanwhile: a head begun before a shutdown is served.
        match read.await {
            Some(Ok(meta)) => Ok(meta),
            Some(Err(refused)) => Err(self.refuse(refused).await),
            None => Err(Stop::Close),
        }
    }

    /// Answers a head that could not be taken; the connection closes. The
    /// answer carries a request ID as any other (`server.request_id`): the
    /// head's own if it was read whole and may be kept, else one made here.
    fn refuse(&self, refused: Refused) -> impl Future<Output = Stop> {
        metrics::rejected("", refused.reason);
        let id = self.app.config().server.request_id.then(|| RequestId::for_given(refused.given_id.as_ref()));
        let request_id = id.as_ref().map_or("-", RequestId::as_str);
        tracing::debug!(client = %self.addr, status = %refused.status, request_id, "request head refused");
        let written = self.last_head(refused.status, id.map(|id| id.header_value()));
        async move { written.await.err().unwrap_or(Stop::Close) }
    }

    /// Writes a bodiless `status` answer that closes the connection, with
    /// `id` as its `X-Request-Id`.
    fn last_head(&self, status: http::StatusCode, id: Option<HeaderValue>) -> impl Future<Output = Result<(), Stop>> {
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = status;
        let asked = Asked { method: &Method::GET, version: Version::HTTP_11, keep_alive: false };
        let mut out = BytesMut::new();
        encode::head(&mut parts, BodyLength::None, asked, id.as_ref(), &mut out);
        self.write(out.freeze())
    }

    /// One request and its response; returns whether the connection may
    /// carry another. The request is made and the app's future started
    /// here, before the exchange's future: that keeps only what the
    /// response needs, not the head.
    fn exchange<'s>(
        &'s mut self,
        meta: Meta,
        parts: &mut Option<request::Parts>,
    ) -> impl Future<Output = Result<bool, Stop>> + use<'s, 'a> {
        let Meta { framing, keep_alive, expect_continue, trailers_ok } = meta;
        let parts = parts.take().expect("read with its meta");
        // Of the method, only what the response's framing turns on (see
        // `encode::head`), kept as a byte while the answer is awaited.
        let framed_as = encode::framed_as(&parts.method);
        let version = parts.version;
        let decoder = match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::new(DecodeFraming::Length(n)),
            Framing::Chunked => Decoder::new(DecodeFraming::Chunked),
        };
        let has_body = framing != Framing::Empty;
        let continue_owed = expect_continue && version == Version::HTTP_11 && has_body;
        let number = self.wire.lock().begin_body(decoder, continue_owed);
        let body = match framing {
            Framing::Empty => Incoming::Empty,
            _ => Incoming::Own(Box::pin(WireBody::new(self.wire.clone(), number))),
        };
        // 1xx answers go to HTTP/1.1 clients only (RFC 9110 §15.2), from
        // the connection's queue (see `Peer::own_h1` and `Peer::interims`).
        let forwards = version == Version::HTTP_11;
        if forwards && !self.state.peer.own_h1() {
            self.state.peer.own_h1.store(true, Relaxed);
        }
        let in_flight = self.state.request_started(false, framing == Framing::Empty);
        let req = Request::from_parts(parts, body);
        // Boxed, as hyper's connection boxes its service's future: inline,
        // the app's future would be kept in every connection's task, idle
        // or not. Written into its box, as hyper writes it: `Box::pin` of
        // the new future copied all its room, some 8 KiB, from the stack.
        // The box is the thread's (see `slot`), as hyper's is the
        // connection's; one cut mid-way is dropped with its future.
        let mut slot = slot::take();
        slot.set(Some(super::answer(self.app.clone(), self.kind, req, in_flight, true)));
        async move {
            let answer = slot.as_mut().as_pin_mut().expect("just set");
            // Each in a block of its own: a local borrowed, or one that
            // outlives an await, is kept in this future while the answer's
            // body is written, which made the exchange's box larger than
            // the allocator's per-thread cache takes (see
            // benches/README.md, Decisions).
            let response = {
                let mut response = None;
                self.flags.unanswered.store(true, Relaxed);
                let waited = self.wait_for_answer(answer, forwards, &mut response).await;
                self.flags.unanswered.store(false, Relaxed);
                waited?;
                response.expect("set when the wait ends well")
            };
            slot::give_back(slot);
            if version != Version::HTTP_11 {
                // None goes to an HTTP/1.0 client: those its upstream sent
                // to the connection's queue are not for the next request.
                while self.state.peer.interims.get().and_then(Interims::take).is_some() {}
            }
            let keep_alive = keep_alive && !self.flags.closing();
            // A body nobody reads any more is settled before the head
            // says whether the connection goes on.
            let settled = match keep_alive && has_body {
                true => self.wire.lock().settle_unread(),
                false => None,
            };
            let keep_alive = keep_alive && settled != Some(false);
            let (body, encoder, out, last) = {
                let method = framed_as.method();
                let asked = Asked { method: &method, version, keep_alive };
                respond::response_head(response, asked, trailers_ok)
            };
            self.respond(body, encoder, out).await?;
            Ok(!last && !self.flags.closing() && settled.unwrap_or_else(|| self.wire.lock().body_drained()))
        }
    }

    /// Waits for the answer, forwarding the 1xx heads that come before it
    /// and watching the socket once the request body is in: a client that
    /// closes its side meanwhile has left (as hyper's connection sees it),
    /// and its request is dropped. The answer is put in `out`, not
    /// returned: handed back through the futures, it was copied whole at
    /// each level (see benches/README.md, Decisions).
    async fn wait_for_answer<F: Future<Output = Response<ConnBody>>>(
        &mut self,
        answer: F,
        forwards: bool,
        out: &mut Option<Response<ConnBody>>,
    ) -> Result<(), Stop> {
        // The queue, looked for at each poll: an upstream makes it at its
        // first 1xx (see `Peer::interims`).
        let state = self.state;
        let queue = || if forwards { state.peer.interims.get() } else { None };
        let mut answer = pin!(answer);
        let mut watching = true;
        loop {
            let wire = self.wire;
            let watch = std::future::poll_fn(|cx| match watching {
                true => wire.lock().poll_watch(cx),
                false => Poll::Pending,
            });
            let interim = std::future::poll_fn(|cx| match queue() {
                Some(i) => i.poll_next(cx),
                None => Poll::Pending,
            });
            let raced = async {
                tokio::select! {
                    biased;
                    response = &mut answer => {
                        *out = Some(response);
                        Waited::Answer
                    }
                    interim = interim => Waited::Interim(interim),
                    gone = watch => Waited::Watched(gone),
                }
            };
            match raced.await {
                Waited::Answer => {
                    // Those that came with the answer's head go first.
                    while let Some(interim) = queue().and_then(Interims::take) {
                        self.forward_interim(&interim).await?;
                    }
                    return Ok(());
                }
                Waited::Interim(interim) => self.forward_interim(&interim).await?,
                Waited::Watched(Ok(false)) => watching = false,
                Waited::Watched(_) => {
                    tracing::debug!(client = %self.addr, "client closed the connection while its request was in flight");
                    return Err(Stop::Cut);
                }
            }
        }
    }
}
