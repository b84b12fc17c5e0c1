//! W3C trace context (Trace Context Level 1): a valid `traceparent` is
//! continued (same trace ID; this hop's span becomes the parent the upstream
//! sees; `tracestate` passed on), anything else starts a new trace.
//!
//! Parsing is hand-written: the format is four fixed-width hex fields, and
//! the OpenTelemetry propagator builds a whole `Context` (allocations on
//! every request) even when nothing is exported, on a path measured in
//! instructions per request.

use http::header::{HeaderMap, HeaderValue};

use super::request_id::hex;
use crate::headers::Stamp;
use crate::headers::stamp::Traceparent;

pub use crate::headers::{TRACEPARENT, TRACESTATE};
/// The `sampled` trace flag.
const SAMPLED: u8 = 0x01;

/// The trace a request belongs to and this hop's span in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// This hop's span: the parent the upstream sees.
    pub span_id: u64,
    /// The caller's span, when the trace was continued.
    pub parent_id: Option<u64>,
    pub flags: u8,
    /// The request carried a `tracestate` of a trace not continued, which
    /// the upstream must not get.
    pub stale_state: bool,
}

impl TraceContext {
    /// Continues the request's trace, or starts one. Of the caller's flags
    /// only `sampled` is kept: Level 1 defines no other, and asks a hop to
    /// send the others as zero.
    pub fn from_headers(headers: &HeaderMap) -> TraceContext {
        // One pass over the names finds both, where a lookup hashes the name
        // byte by byte: two lookups cost far more than the pass (see
        // benches/README.md, Decisions). Most requests carry neither, and
        // then nothing is looked up.
        let (mut parent, mut state) = (false, false);
        for name in headers.keys() {
            parent |= *name == TRACEPARENT;
            state |= *name == TRACESTATE;
        }
        // Sent twice, it is invalid (the W3C test suite's
        // `test_traceparent_duplicated`): a new trace starts.
        let given = if parent {
            let mut sent = headers.get_all(TRACEPARENT).iter();
            match (sent.next(), sent.next()) {
                (Some(v), None) => parse(v.as_bytes()),
                _ => None,
            }
        } else {
            None
        };
        match given {
            Some((trace_id, parent_id, flags)) => TraceContext {
                trace_id,
                span_id: nonzero_u64(),
                parent_id: Some(parent_id),
                flags: flags & SAMPLED,
                stale_state: false,
            },
            None => TraceContext { stale_state: state, ..TraceContext::root() },
        }
    }

    /// A new trace, starting here. Sampled: exported if anything is.
    pub fn root() -> TraceContext {
        TraceContext {
            trace_id: nonzero_u128(),
            span_id: nonzero_u64(),
            parent_id: None,
            flags: SAMPLED,
            stale_state: false,
        }
    }

    /// Whether the caller asked for this trace to be recorded.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The `traceparent` the upstream gets.
    pub fn traceparent(&self) -> HeaderValue {
        let buf = self.traceparent_bytes();
        super::request_id::copied_value(&buf).expect("hex digits and dashes are a valid header value")
    }

    /// [`TraceContext::traceparent`]'s bytes.
    pub fn traceparent_bytes(&self) -> Traceparent {
        let mut buf = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex(self.trace_id, &mut buf[3..35]);
        hex(u128::from(self.span_id), &mut buf[36..52]);
        hex(u128::from(self.flags), &mut buf[53..55]);
        buf
    }

    /// The trace ID as 32 hex digits, for logs.
    pub fn trace_id_hex(&self) -> String {
        let mut buf = [0u8; 32];
        hex(self.trace_id, &mut buf);
        String::from_utf8(buf.to_vec()).expect("hex is UTF-8")
    }

    /// Sets the headers an upstream receives: this hop's `traceparent`
    /// (stamped when the request carried none, see
    /// [`crate::headers::stamp`]), and the caller's `tracestate` only when
    /// its trace was continued (a restarted trace drops the old state, as
    /// the spec asks).
    pub fn propagate(&self, headers: &mut HeaderMap, stamp: &mut Stamp) {
        if stamp.carried.traceparent {
            headers.insert(TRACEPARENT, self.traceparent());
        } else {
            stamp.add_traceparent(self.traceparent_bytes());
        }
        if self.stale_state {
            headers.remove(TRACESTATE);
        }
    }
}

// Drawn again on zero (the W3C's invalid ID), rather than with
// `fastrand::u128(1..)`: a range costs a 128-bit division every draw, and a
// zero comes once in 2^64 draws at most.
fn nonzero_u64() -> u64 {
    std::iter::repeat_with(|| fastrand::u64(..)).find(|&n| n != 0).expect("endless")
}

fn nonzero_u128() -> u128 {
    std::iter::repeat_with(|| fastrand::u128(..)).find(|&n| n != 0).expect("endless")
}

/// `(trace_id, parent_id, flags)` of a valid `traceparent`.
fn parse(v: &[u8]) -> Option<(u128, u64, u8)> {
    // version "-" trace-id "-" parent-id "-" flags; version 00 is exactly 55
    // bytes; a later version may append "-" and more, which is ignored.
    if v.len() < 55 || (v.len() > 55 && v[55] != b'-') || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = lower_hex(&v[0..2])? as u8;
    if version == 0xff || (version == 0 && v.len() != 55) {
        return None;
    }
    let trace_id = lower_hex(&v[3..35])?;
    let parent_id = lower_hex(&v[36..52])? as u64;
    let flags = lower_hex(&v[53..55])? as u8;
    (trace_id != 0 && parent_id != 0).then_some((trace_id, parent_id, flags))
}

/// Lower-case hex only, as the spec requires.
fn lower_hex(b: &[u8]) -> Option<u128> {
    b.iter().try_fold(0u128, |n, &c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        Some(n << 4 | u128::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an upstream is sent: [`TraceContext::propagate`], then the
    /// stamp put into the map (as for an HTTP/2 upstream).
    fn sent(t: &TraceContext, headers: &mut HeaderMap) {
        let mut stamp = Stamp::default();
        stamp.carried.traceparent = headers.contains_key(TRACEPARENT);
        t.propagate(headers, &mut stamp);
        stamp.insert_into(headers);
    }

    #[test]
    fn parse_table() {
        let ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        type Parsed = Option<(u128, u64, u8)>;
        let cases: &[(&str, Parsed)] = &[
            (ok, Some((0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, 1))),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
                Some((0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, 0)),
            ),
            // A later version may carry more after a dash.
            (
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                Some((0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, 1)),
            ),
            ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),
            ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
            ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
            ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
            ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),
            ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", None),
            ("00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
            ("00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01", None),
            ("", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse(v.as_bytes()), *want, "{v}");
        }
    }

    #[test]
    fn continued_trace_keeps_its_id_and_gets_a_new_parent() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let t = TraceContext::from_headers(&h);
        assert_eq!(t.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent_id, Some(0xb7ad6b7169203331));
        let mut out = h.clone();
        sent(&t, &mut out);
        let sent = out[TRACEPARENT].to_str().unwrap().to_owned();
        assert!(sent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"), "{sent}");
        assert!(!sent.contains("b7ad6b7169203331"), "the upstream's parent is this hop: {sent}");
        assert!(sent.ends_with("-01"));
        assert_eq!(parse(sent.as_bytes()).map(|p| p.1), Some(t.span_id));
        assert_eq!(out[TRACESTATE], "vendor=1");
    }

    #[test]
    fn only_the_sampled_flag_is_kept() {
        for (flags, sent, sampled) in [("01", "01", true), ("00", "00", false), ("ff", "01", true), ("fe", "00", false)]
        {
            let mut h = HeaderMap::new();
            let v = format!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}");
            h.insert(TRACEPARENT, HeaderValue::from_str(&v).unwrap());
            let t = TraceContext::from_headers(&h);
            assert_eq!(t.sampled(), sampled, "{flags}");
            assert!(t.traceparent().to_str().unwrap().ends_with(&format!("-{sent}")), "{flags}");
        }
    }

    /// The caller's `tracestate` goes only with its continued trace; one set
    /// on the way (a route's header rule) is left alone.
    #[test]
    fn tracestate_goes_on_only_with_its_trace() {
        let valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let invalid = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01";
        // (traceparent sent, tracestate sent, tracestate the upstream gets)
        let cases: &[(Option<&str>, Option<&str>, Option<&str>)] = &[
            (Some(valid), Some("vendor=1"), Some("vendor=1")),
            (Some(invalid), Some("vendor=1"), None),
            (None, Some("vendor=1"), None),
            (Some(valid), None, None),
            (None, None, None),
        ];
        for (parent, state, want) in cases {
            let mut h = HeaderMap::new();
            h.insert(http::header::ACCEPT, HeaderValue::from_static("*/*"));
            if let Some(p) = parent {
                h.insert(TRACEPARENT, HeaderValue::from_static(p));
            }
            if let Some(s) = state {
                h.insert(TRACESTATE, HeaderValue::from_static(s));
            }
            // The same, with its traceparent sent twice: a new trace, without
            // the state.
            if parent.is_some() {
                let mut twice = h.clone();
                twice.append(TRACEPARENT, HeaderValue::from_static(valid));
                let t = TraceContext::from_headers(&twice);
                assert_eq!(t.parent_id, None, "{parent:?} twice");
                sent(&t, &mut twice);
                assert!(twice.get(TRACESTATE).is_none() && twice.get_all(TRACEPARENT).iter().count() == 1);
            }
            let t = TraceContext::from_headers(&h);
            let mut out = h.clone();
            sent(&t, &mut out);
            assert_eq!(out.get(TRACESTATE).map(|v| v.to_str().unwrap()), *want, "{parent:?} {state:?}");
            assert!(parse(out[TRACEPARENT].as_bytes()).is_some());
        }
        // Set on the way, with no trace of the caller's to contradict it.
        let t = TraceContext::from_headers(&HeaderMap::new());
        let mut out = HeaderMap::new();
        out.insert(TRACESTATE, HeaderValue::from_static("set=by-rule"));
        sent(&t, &mut out);
        assert_eq!(out[TRACESTATE], "set=by-rule");
    }

    #[test]
    fn an_invalid_traceparent_starts_a_new_trace_without_its_state() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static("00-00000000000000000000000000000000-b7ad6b7169203331-01"));
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let t = TraceContext::from_headers(&h);
        assert_eq!(t.parent_id, None);
        assert_ne!(t.trace_id, 0);
        let mut out = h.clone();
        sent(&t, &mut out);
        assert!(parse(out[TRACEPARENT].as_bytes()).is_some());
        assert!(out.get(TRACESTATE).is_none());
    }
}
