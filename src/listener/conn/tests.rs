//! The connection watchdog's deadlines, on tokio's paused clock; a parked
//! connection's listing.

use super::*;

const T: Timeouts = Timeouts {
    header_read: Duration::from_millis(100),
    idle: Duration::from_millis(1000),
    send: Duration::from_millis(500),
};

fn connection() -> (Arc<ConnState>, Watchdog) {
    let state = Arc::new(ConnState::new(Peer::new([127, 0, 0, 1].into(), false, false), 1, Arc::new(T)));
    let watchdog = Watchdog::new(state.clone());
    (state, watchdog)
}

/// Runs the watchdog for `ms` of paused time: what expired, if anything.
async fn run_for(w: &mut Watchdog, ms: u64) -> Option<Expired> {
    tokio::time::timeout(Duration::from_millis(ms), w).await.ok()
}

#[tokio::test(start_paused = true)]
async fn first_head_then_idle_then_send() {
    let (state, mut w) = connection();
    // No request at all: the header timeout from accept.
    assert_eq!(run_for(&mut w, 150).await, Some(Expired::HeaderTimeout));

    let (state2, mut w) = connection();
    let request = state2.request_started(false, true);
    // Busy: the header and idle timeouts do not apply.
    assert_eq!(run_for(&mut w, 2000).await, None);
    drop(request);
    assert_eq!(run_for(&mut w, 900).await, None);
    assert_eq!(run_for(&mut w, 200).await, Some(Expired::Idle));

    // A write that stays blocked: the send timeout, busy or not.
    let (state3, mut w) = connection();
    let _request = state3.request_started(false, true);
    state3.write_pending();
    assert_eq!(run_for(&mut w, 400).await, None);
    assert_eq!(run_for(&mut w, 200).await, Some(Expired::SendTimeout));
    drop(state);
}

#[tokio::test(start_paused = true)]
async fn a_second_head_is_timed_from_its_first_byte() {
    let (state, mut w) = connection();
    drop(state.request_started(false, true));
    assert_eq!(run_for(&mut w, 500).await, None);
    state.read_bytes();
    assert_eq!(run_for(&mut w, 150).await, Some(Expired::HeaderTimeout));
}

#[tokio::test(start_paused = true)]
async fn a_head_pipelined_behind_a_bodiless_request_is_timed_from_its_end() {
    let (state, mut w) = connection();
    let request = state.request_started(false, true);
    state.read_bytes();
    assert_eq!(run_for(&mut w, 2000).await, None, "busy: no header timeout yet");
    drop(request);
    assert_eq!(run_for(&mut w, 150).await, Some(Expired::HeaderTimeout));
    // Behind a request with a body, the bytes may be that body: idle.
    let (state, mut w) = connection();
    let request = state.request_started(false, false);
    state.read_bytes();
    drop(request);
    assert_eq!(run_for(&mut w, 900).await, None);
    assert_eq!(run_for(&mut w, 200).await, Some(Expired::Idle));
    // Nothing read behind it: `a_second_head_is_timed_from_its_first_byte`.
}

#[tokio::test(start_paused = true)]
async fn closing_never_cuts_a_request_in_flight() {
    let (state, mut w) = connection();
    drop(state.request_started(true, true));
    assert_eq!(run_for(&mut w, 1100).await, Some(Expired::Idle));
    w.closing(Duration::from_millis(100));
    // A request the client sent before it saw the GOAWAY: served, however
    // long it takes, and only then is the grace counted.
    let late = state.request_started(true, true);
    assert_eq!(run_for(&mut w, 3000).await, None);
    drop(late);
    assert_eq!(run_for(&mut w, 50).await, None);
    assert_eq!(run_for(&mut w, 100).await, Some(Expired::GraceOver));
}

#[tokio::test(start_paused = true)]
async fn an_http2_stream_waiting_on_a_full_window_is_a_send_timeout() {
    let (state, mut w) = connection();
    let request = state.request_started(true, true);
    let mut body = ConnBody::new(Body::full("data"), request, None);
    // The body hands out its data and is never polled again.
    let waker = futures_util::task::noop_waker();
    let frame = http_body::Body::poll_frame(Pin::new(&mut body), &mut Context::from_waker(&waker));
    assert!(matches!(frame, Poll::Ready(Some(Ok(_)))));
    // Other writes on the connection do not excuse it.
    for _ in 0..4 {
        state.wrote();
        assert_eq!(run_for(&mut w, 100).await, None);
    }
    assert!(matches!(run_for(&mut w, 300).await, Some(Expired::SendTimeout)));
    drop(body);
}

fn state() -> ConnState {
    ConnState::new(Peer::new([127, 0, 0, 1].into(), false, false), 1, Arc::new(T))
}

/// Whether a connection is in its listener's list, through the listener's
/// looks (`unlist`: a busy or parked one is dropped) and the connection's
/// idle waits and wakes (which put it back if it was dropped), in the
/// orders they can come in: it is listed once whenever it waits idle with
/// its task or has just woken, never twice, never lost.
#[test]
fn a_connection_is_listed_once_through_looks_idle_waits_and_wakes() {
    let s = state();
    // Watched at its start, busy.
    let mut listed = 1;
    listed -= i32::from(s.unlist());
    assert_eq!(listed, 0, "a look drops a busy connection");
    assert!(!s.unlist(), "once");
    listed += i32::from(s.set_idle());
    assert_eq!(listed, 1, "its idle wait puts it back");
    assert!(!s.unlist(), "an idle connection stays listed");
    s.set_busy();
    // Parked, then the look, then the wake.
    s.set_parked();
    listed -= i32::from(s.unlist());
    listed += i32::from(s.unpark());
    assert_eq!(listed, 1, "the look, then the wake");
    // Parked, then the wake, then the look (which finds it busy).
    s.set_parked();
    listed += i32::from(s.unpark());
    listed -= i32::from(s.unlist());
    listed += i32::from(s.set_idle());
    assert_eq!(listed, 1, "the wake, then the look, then its idle wait");
    // Dropped while busy, just before it parks: parked, it stays out,
    // and its wake puts it back.
    s.set_busy();
    listed -= i32::from(s.unlist());
    s.set_parked();
    assert!(!s.unlist(), "already out");
    listed += i32::from(s.unpark());
    assert_eq!(listed, 1, "dropped busy, then parked, then woken");
}

/// Polls `w` once with this task's cooperative budget used up first: as a
/// connection's task polls its watchdog after an exchange whose socket
/// reads and writes took the budget (pipelined requests the gateway
/// answers itself, a body streamed fast).
async fn poll_without_budget(w: &mut Watchdog) -> Poll<Expired> {
    // A fresh budget, then all of it spent.
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| {
        while tokio::task::coop::has_budget_remaining() {
            assert!(Pin::new(&mut Box::pin(tokio::task::coop::consume_budget())).poll(cx).is_ready());
        }
        Poll::Ready(Pin::new(&mut *w).poll(cx))
    })
    .await
}

/// A watchdog first polled when the task's budget is spent: tokio refuses
/// that poll of its timer before the timer is even started (and so
/// before it holds the task's waker). The timer must be polled again at
/// the task's next wake, not taken for one that waits: else it never
/// starts, never fires, and the connection has no header, idle or send
/// timeout for the rest of its life.
#[tokio::test(start_paused = true)]
async fn a_first_poll_without_budget_does_not_stop_the_timeouts() {
    let (_state, w) = connection();
    let task = tokio::spawn(async move {
        let mut w = w;
        assert!(poll_without_budget(&mut w).await.is_pending());
        // From here on, only the watchdog's timer wakes this task.
        w.await
    });
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(task.is_finished(), "the header timeout (at 100 ms) never came");
    assert_eq!(task.await.unwrap(), Expired::HeaderTimeout);
}
