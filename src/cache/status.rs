//! `Cache-Status` (RFC 9211): what the cache did with a request, as a
//! header on every answer of a cache route.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};

use crate::error::GatewayError;

/// What the cache did, as `Cache-Status` says it (RFC 9211 §2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    pub(super) hit: bool,
    pub(super) fwd: Option<&'static str>,
    pub(super) fwd_status: Option<u16>,
    pub(super) stored: bool,
    /// Whole seconds of freshness left (see [`secs`]).
    pub(super) ttl: Option<u64>,
    pub(super) stale: bool,
}

/// A freshness left as `ttl=` says it: in whole seconds.
pub(super) fn secs(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|d| d.as_secs())
}

impl Status {
    pub(super) fn hit(ttl: Option<Duration>) -> Status {
        Status { hit: true, ttl: secs(ttl), ..Status::default() }
    }

    pub(super) fn stale() -> Status {
        Status { hit: true, stale: true, ..Status::default() }
    }

    /// A stale entry served because the upstream failed: the request was
    /// forwarded (RFC 9211 §2.2), and `code` is what the upstream answered,
    /// if it answered.
    pub(super) fn on_error(code: Option<u16>) -> Status {
        Status { fwd: Some("stale"), fwd_status: code, stale: true, ..Status::default() }
    }

    pub(super) fn fwd(fwd: &'static str) -> Status {
        Status { fwd: Some(fwd), ..Status::default() }
    }

    /// The value, its `detail` naming the targeted field (RFC 9213) that
    /// decided the entry's policy, if one did: `detail="NAME"`, or
    /// `detail="stale NAME"` for an entry served stale.
    pub(super) fn value_for(&self, targeted: Option<&HeaderName>) -> HeaderValue {
        let mut v = Line::default();
        v.push(b"gateway");
        if self.hit {
            v.push(b"; hit");
        }
        if let Some(fwd) = self.fwd {
            v.push(b"; fwd=");
            v.push(fwd.as_bytes());
        }
        if let Some(s) = self.fwd_status {
            v.push(b"; fwd-status=");
            v.number(u64::from(s));
        }
        if self.stored {
            v.push(b"; stored");
        }
        if let Some(ttl) = self.ttl {
            v.push(b"; ttl=");
            v.number(ttl);
        }
        match (self.stale, targeted) {
            (false, None) => {}
            (true, None) => v.push(b"; detail=stale"),
            (stale, Some(name)) => {
                let start: &[u8] = if stale { b"; detail=\"stale " } else { b"; detail=\"" };
                v.push(start);
                v.push(name.as_str().as_bytes());
                v.push(b"\"");
            }
        }
        v.value()
    }
}

/// The `Age` and `Cache-Status` of an entry's latest answer from the
/// store, kept for the next: they change about once a second, and making
/// them cost two allocations on every hit.
#[derive(Default)]
pub struct Stamps(Mutex<Option<Stamp>>);

struct Stamp {
    age: u64,
    status: Status,
    values: (HeaderValue, HeaderValue),
}

impl Stamps {
    /// `Age: age` and `status`'s `Cache-Status`, made or as last made;
    /// `targeted` is the entry's own (see [`Status::value_for`]).
    pub(super) fn get(&self, age: u64, status: Status, targeted: Option<&HeaderName>) -> (HeaderValue, HeaderValue) {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some(s) if s.age == age && s.status == status => s.values.clone(),
            _ => {
                let values = (number(age), status.value_for(targeted));
                *last = Some(Stamp { age, status, values: values.clone() });
                values
            }
        }
    }
}

/// `n` in decimal as a header value (`Age`).
pub(super) fn number(n: u64) -> HeaderValue {
    let mut v = Line::default();
    v.number(n);
    v.value()
}

/// A header value built on the stack and copied once into its own
/// allocation: made for every hit, and a `String` or http's `From<u64>`
/// would allocate twice (the buffer, then the shared `Bytes` for its spare
/// capacity).
struct Line {
    buf: [u8; 192],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line { buf: [0; 192], len: 0 }
    }
}

impl Line {
    /// Appends `s`; the longest value built here (with the longest
    /// targeted field name configuration allows) is within the buffer.
    fn push(&mut self, s: &[u8]) {
        self.buf[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
    }

    /// Appends `n` in decimal.
    fn number(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut n = n;
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn value(&self) -> HeaderValue {
        HeaderValue::from_maybe_shared(Bytes::copy_from_slice(&self.buf[..self.len])).expect("ASCII")
    }
}

/// `Cache-Status` of the gateway's own error answer on a cache route: an
/// `only-if-cached` miss went nowhere; any other failed going upstream.
pub fn error_status(e: &GatewayError) -> HeaderValue {
    match e {
        GatewayError::NotCached => HeaderValue::from_static("gateway; detail=not-cached"),
        _ => HeaderValue::from_static("gateway; fwd=miss"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_status_values() {
        let cases = [
            (Status::hit(Some(Duration::from_millis(999))), "gateway; hit; ttl=0"),
            (Status::hit(Some(Duration::from_secs(u64::MAX))), "gateway; hit; ttl=18446744073709551615"),
            (Status::stale(), "gateway; hit; detail=stale"),
            (Status::fwd("bypass"), "gateway; fwd=bypass"),
            (Status::on_error(Some(503)), "gateway; fwd=stale; fwd-status=503; detail=stale"),
            (Status::on_error(None), "gateway; fwd=stale; detail=stale"),
            (
                Status { fwd: Some("stale"), fwd_status: Some(304), ttl: Some(42), ..Status::default() },
                "gateway; fwd=stale; fwd-status=304; ttl=42",
            ),
            (
                Status { fwd: Some("miss"), stored: true, ttl: Some(7), ..Status::default() },
                "gateway; fwd=miss; stored; ttl=7",
            ),
        ];
        for (status, want) in cases {
            assert_eq!(status.value_for(None), want);
        }
        let longest = Status { fwd: Some("request"), fwd_status: Some(599), stored: true, ..Status::stale() };
        let longest = Status { ttl: Some(u64::MAX), ..longest };
        let want = "gateway; hit; fwd=request; fwd-status=599; stored; ttl=18446744073709551615; detail=stale";
        assert_eq!(longest.value_for(None), want);
        let cdn = HeaderName::from_static("cdn-cache-control");
        assert_eq!(
            Status::hit(Some(Duration::from_secs(5))).value_for(Some(&cdn)),
            "gateway; hit; ttl=5; detail=\"cdn-cache-control\""
        );
        assert_eq!(Status::stale().value_for(Some(&cdn)), "gateway; hit; detail=\"stale cdn-cache-control\"");
        let name = HeaderName::from_bytes(&[b'x'; crate::config::MAX_TARGETED_NAME]).unwrap();
        let value = longest.value_for(Some(&name));
        assert!(value.to_str().unwrap().ends_with(&format!("; detail=\"stale {}\"", name.as_str())));
        for (n, want) in [(0, "0"), (7, "7"), (86_400, "86400"), (u64::MAX, "18446744073709551615")] {
            assert_eq!(number(n), want);
        }
    }

    /// The values kept are the ones asked for: a new age or status makes
    /// new ones.
    #[test]
    fn stamps_follow_the_age_and_the_status() {
        let stamps = Stamps::default();
        let hit = |s| Status::hit(Some(Duration::from_secs(s)));
        let cases = [
            (5, hit(3), "5", "gateway; hit; ttl=3"),
            (5, hit(3), "5", "gateway; hit; ttl=3"),
            (6, hit(3), "6", "gateway; hit; ttl=3"),
            (6, hit(2), "6", "gateway; hit; ttl=2"),
            (6, Status::stale(), "6", "gateway; hit; detail=stale"),
            (5, hit(3), "5", "gateway; hit; ttl=3"),
        ];
        for (age, status, want_age, want_status) in cases {
            let (a, s) = stamps.get(age, status, None);
            assert_eq!((a.to_str().unwrap(), s.to_str().unwrap()), (want_age, want_status));
        }
    }
}
