//! Sockets: binding and accepting listeners, and the send-buffer limit that
//! lets client and upstream sockets show write progress. A leaf: the
//! listeners and the upstream pool both use it, and it uses neither.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Binds a TCP listener with a backlog large enough for load tests
/// (std's default of 128 drops connections under bursts).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    listen(socket(addr)?, addr)
}

/// [`bind`] for the listener `key` configures (`server.listen`), with the
/// socket options of its connections ([`configure`]) set on it before it
/// listens: Linux gives them to each connection it accepts, from the first
/// (one set later would miss those already queued), so the accept loop sets
/// none per connection ([`configured`]). An error names the address and
/// the key, and says how to move it when it is taken.
pub async fn bind_for(key: &str, addr: SocketAddr, tcp_keepalive: Option<Duration>) -> std::io::Result<TcpListener> {
    let bound = socket(addr).and_then(|s| {
        configure(&s, tcp_keepalive);
        listen(s, addr)
    });
    bound.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                let var = format!("GATEWAY__{}", key.to_uppercase().replace('.', "__"));
                format!("; another process holds it: set {key} (or {var}) to a free address")
            }
            _ => String::new(),
        };
        std::io::Error::new(e.kind(), format!("cannot listen on {addr} ({key}): {e}{hint}"))
    })
}

/// A TCP socket for a listener at `addr`, not yet bound.
fn socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    Ok(socket)
}

/// `socket` bound to `addr` and listening.
fn listen(socket: tokio::net::TcpSocket, addr: SocketAddr) -> std::io::Result<TcpListener> {
    socket.bind(addr)?;
    socket.listen(4096)
}

/// Socket options for an accepted connection, set on it or, before it
/// listens, on its listener.
pub fn configure(socket: &impl std::os::fd::AsFd, tcp_keepalive: Option<Duration>) {
    let socket = socket2::SockRef::from(socket);
    let _ = socket.set_tcp_nodelay(true);
    if let Some(idle) = tcp_keepalive {
        // Probes after `idle` of silence, then every quarter of it: a peer
        // that vanished (power loss, a dropped NAT entry) is noticed and its
        // slot freed instead of waiting for a timeout that may never run.
        let (time, interval) = keepalive_times(idle);
        let keepalive =
            socket2::TcpKeepalive::new().with_time(time).with_interval(interval).with_retries(KEEPALIVE_PROBES);
        if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
            tracing::debug!(error = %e, "cannot enable TCP keepalive");
        }
    }
}

/// Unanswered keepalive probes before a connection is dropped.
const KEEPALIVE_PROBES: u32 = 4;

/// The keepalive idle time and probe interval for `idle`, in the whole
/// seconds the kernel keeps.
fn keepalive_times(idle: Duration) -> (Duration, Duration) {
    let interval = (idle / 4).max(Duration::from_secs(1));
    (Duration::from_secs(idle.as_secs()), Duration::from_secs(interval.as_secs()))
}

/// Whether `listener`'s accepted connections have from it, on this system,
/// every option [`configure`] would set on them: a listener from
/// [`bind_for`] on Linux; not one from [`bind`], nor elsewhere.
pub fn configured(listener: &TcpListener, tcp_keepalive: Option<Duration>) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let s = socket2::SockRef::from(listener);
    let keepalive = match tcp_keepalive {
        None => true,
        Some(idle) => {
            let (time, interval) = keepalive_times(idle);
            s.keepalive().unwrap_or(false)
                && s.tcp_keepalive_time().ok() == Some(time)
                && s.tcp_keepalive_interval().ok() == Some(interval)
                && s.tcp_keepalive_retries().ok() == Some(KEEPALIVE_PROBES)
        }
    };
    s.tcp_nodelay().unwrap_or(false) && keepalive
}

/// Accepts the next connection. On errors such as EMFILE it logs and backs
/// off for a moment instead of spinning.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Unsent bytes the kernel may hold for a socket before it stops accepting
/// writes (`TCP_NOTSENT_LOWAT`). Without it a socket becomes writable again
/// only after a third of its (auto-tuned, up to 4 MiB) send buffer drains,
/// so a client reading steadily but slowly looked stopped to the send
/// timeout; with it, writes make progress every 64 KiB the client takes.
/// Set on a socket just before its first large write (a body that may pass
/// 64 KiB), not at accept: on a socket that has it, every ACK signals write
/// space, which makes every small request dearer (see benches/README.md);
/// and set once the buffer is already full it is too late to help.
pub const NOTSENT_LOWAT: u32 = 64 * 1024;

/// Sets [`NOTSENT_LOWAT`] on `stream`.
pub fn limit_unsent(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_notsent_lowat(NOTSENT_LOWAT) {
        tracing::debug!(error = %e, "cannot set TCP_NOTSENT_LOWAT");
    }
}

/// Reads into `rx` straight when it has room for `READ` bytes, else through
/// a buffer of `READ` on the stack, so that a read that waits holds no
/// memory. A read that fills the stack buffer leaves room in `rx` for the
/// next (a body streaming in). Both HTTP/1 connections read this way.
pub fn poll_fill<const READ: usize, T: tokio::io::AsyncRead + Unpin>(
    io: &mut T,
    rx: &mut bytes::BytesMut,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<std::io::Result<usize>> {
    if rx.capacity() - rx.len() >= READ {
        return tokio_util::io::poll_read_buf(std::pin::Pin::new(io), cx, rx);
    }
    let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); READ];
    let mut buf = tokio::io::ReadBuf::uninit(&mut stack);
    std::task::ready!(std::pin::Pin::new(io).poll_read(cx, &mut buf))?;
    let got = buf.filled();
    if got.len() == READ {
        rx.reserve(4 * READ);
    }
    rx.extend_from_slice(got);
    std::task::Poll::Ready(Ok(got.len()))
}

/// Write buffers kept per thread at most, and their bytes at most: enough
/// for the heads a worker's connections have out at once (a request's
/// head is held until its answer comes, for a stale connection's resend),
/// while a burst's buffers beyond them go back to the allocator.
const KEPT: usize = 32;
const KEPT_BYTES: usize = 64 * 1024;

/// The largest write buffer kept (the own HTTP/1.1 connection's
/// coalescing size, which checks that it is): a larger one goes back to
/// the allocator.
pub const KEPT_MAX: usize = 16 * 1024;

thread_local! {
    /// Write buffers written and given back, for the next head encoded on
    /// this thread, and their bytes: a new one per head cost an allocation
    /// and its free, where hyper's connections keep their write buffers
    /// for their life. An idle connection holds none.
    static SPARE: std::cell::RefCell<(Vec<bytes::BytesMut>, usize)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
}

/// An empty buffer with room for `n` bytes: a kept one if the thread has one.
pub fn write_buffer(n: usize) -> bytes::BytesMut {
    let kept = SPARE.with_borrow_mut(|(spare, bytes)| {
        let out = spare.pop()?;
        *bytes -= out.capacity();
        Some(out)
    });
    match kept {
        Some(mut out) => {
            out.reserve(n);
            out
        }
        None => bytes::BytesMut::with_capacity(n),
    }
}

/// `out`, written, kept for [`write_buffer`] if it is not too large and
/// the thread keeps fewer than `KEPT` (`KEPT_BYTES` in all).
pub fn give_back(mut out: bytes::BytesMut) {
    let room = out.capacity();
    if room == 0 || room > KEPT_MAX {
        return;
    }
    out.clear();
    SPARE.with_borrow_mut(|(spare, bytes)| {
        if spare.len() < KEPT && *bytes + room <= KEPT_BYTES {
            *bytes += room;
            spare.push(out);
        }
    });
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;

    /// A write buffer given back comes back empty, with its room; one past
    /// `KEPT_MAX` is not kept, nor more than `KEPT`, nor more than
    /// `KEPT_BYTES` in all; the count of bytes follows takes and gives.
    #[test]
    fn a_write_buffer_given_back_is_reused_empty() {
        std::thread::spawn(|| {
            let kept = || SPARE.with_borrow(|(spare, bytes)| (spare.len(), *bytes));
            let mut out = write_buffer(300);
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
            let (at, room) = (out.as_ptr(), out.capacity());
            give_back(out);
            assert_eq!(kept(), (1, room));
            let again = write_buffer(100);
            assert_eq!(again.as_ptr(), at, "the buffer is reused");
            assert!(again.is_empty() && again.capacity() >= 300);
            assert_eq!(kept(), (0, 0));
            give_back(again);
            give_back(BytesMut::with_capacity(KEPT_MAX + 1));
            assert_eq!(kept().0, 1);
            (0..KEPT + 1).for_each(|_| give_back(BytesMut::with_capacity(64)));
            assert_eq!(kept().0, KEPT);
            while kept().0 > 0 {
                drop(write_buffer(0));
            }
            assert_eq!(kept(), (0, 0));
            (0..KEPT).for_each(|_| give_back(BytesMut::with_capacity(KEPT_MAX)));
            assert_eq!(kept(), (KEPT_BYTES / KEPT_MAX, KEPT_BYTES));
        })
        .join()
        .unwrap();
    }

    /// What the accept loop counts on: a listener from `bind_for` gives
    /// its accepted connections every option `configure` sets, one that
    /// connected before anything was accepted too; one from `bind` is not
    /// taken for configured.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn connections_of_a_configured_listener_have_its_options() {
        let idle = Some(Duration::from_secs(45));
        let listener = bind_for("server.listen", "127.0.0.1:0".parse().unwrap(), idle).await.unwrap();
        assert!(configured(&listener, idle));
        assert!(!configured(&listener, Some(Duration::from_secs(30))), "another keepalive time");
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = accept(&listener).await;
        let s = socket2::SockRef::from(&accepted);
        assert!(s.tcp_nodelay().unwrap(), "TCP_NODELAY");
        assert!(s.keepalive().unwrap(), "SO_KEEPALIVE");
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(45));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(11));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        let plain = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert!(!configured(&plain, None) && !configured(&plain, idle));
    }
}
