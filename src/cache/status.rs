//! `Cache-Status` (RFC 9211): what the cache did with a request, as a
//! header on every answer of a cache route.

use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;

/// What the cache did, as `Cache-Status` says it (RFC 9211 §2).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Status {
    pub(super) hit: bool,
    pub(super) fwd: Option<&'static str>,
    pub(super) fwd_status: Option<u16>,
    pub(super) stored: bool,
    pub(super) ttl: Option<Duration>,
    pub(super) stale: bool,
}

impl Status {
    pub(super) fn hit(ttl: Option<Duration>) -> Status {
        Status { hit: true, ttl, ..Status::default() }
    }

    pub(super) fn stale() -> Status {
        Status { hit: true, stale: true, ..Status::default() }
    }

    pub(super) fn fwd(fwd: &'static str) -> Status {
        Status { fwd: Some(fwd), ..Status::default() }
    }

    pub(super) fn value(&self) -> HeaderValue {
        // Built by hand, not with `format!`: it is made for every hit.
        let mut v = String::with_capacity(64);
        v.push_str("gateway");
        if self.hit {
            v.push_str("; hit");
        }
        if let Some(fwd) = self.fwd {
            v.push_str("; fwd=");
            v.push_str(fwd);
        }
        if let Some(s) = self.fwd_status {
            v.push_str("; fwd-status=");
            push_number(&mut v, u64::from(s));
        }
        if self.stored {
            v.push_str("; stored");
        }
        if let Some(ttl) = self.ttl {
            v.push_str("; ttl=");
            push_number(&mut v, ttl.as_secs());
        }
        if self.stale {
            v.push_str("; detail=stale");
        }
        HeaderValue::from_maybe_shared(Bytes::from(v)).expect("ASCII")
    }
}

/// Appends `n` in decimal.
fn push_number(s: &mut String, n: u64) {
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
    s.push_str(std::str::from_utf8(&digits[i..]).expect("digits"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_status_values() {
        let secs = |s| Some(Duration::from_secs(s));
        let cases = [
            (Status::hit(secs(0)), "gateway; hit; ttl=0"),
            (Status::hit(secs(18_446_744_073_709_551_615)), "gateway; hit; ttl=18446744073709551615"),
            (Status::stale(), "gateway; hit; detail=stale"),
            (Status::fwd("bypass"), "gateway; fwd=bypass"),
            (
                Status { fwd: Some("stale"), fwd_status: Some(304), ttl: secs(42), ..Status::default() },
                "gateway; fwd=stale; fwd-status=304; ttl=42",
            ),
            (
                Status { fwd: Some("miss"), stored: true, ttl: secs(7), ..Status::default() },
                "gateway; fwd=miss; stored; ttl=7",
            ),
        ];
        for (status, want) in cases {
            assert_eq!(status.value(), want);
        }
    }
}
