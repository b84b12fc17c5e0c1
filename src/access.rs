//! The access log: one line per request, written when its response body has
//! been sent (so it can say how many bytes went out), in JSON (one field per
//! item) or in the Apache/nginx combined format plus the request time.
//!
//! The data path fills an [`AccessLine`] as the request goes (the upstream
//! part through [`UpstreamTiming`]), hands it to the response, and the
//! connection's response body counts bytes and writes the line when it is
//! done. Only header values named here are written: `Authorization`,
//! `Cookie`, `Set-Cookie` and `Proxy-Authorization` never are.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{Method, Version};

use crate::config::AccessLogFormat;

/// Whether the process's log lines are JSON (`--log-format json`): then a
/// JSON access line is one with its fields, as every other line; with text
/// logs it is written as one JSON object, so `access_log_format = "json"`
/// gives JSON whatever the log format.
pub static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// The bytes of a client's path, `User-Agent` or `Referer` a line keeps:
/// a head may be as long as `max_header_size`, and log shippers split
/// lines past 16 KiB (so a client could start a line of its own).
pub const MAX_VALUE: usize = 4096;

/// `v`, cut to [`MAX_VALUE`] bytes.
pub fn kept(v: &[u8]) -> &[u8] {
    &v[..v.len().min(MAX_VALUE)]
}

/// What the proxy learns about its upstream exchange, for the log.
#[derive(Debug, Default)]
pub struct UpstreamTiming {
    /// The endpoint the response came from.
    pub endpoint: Mutex<Option<String>>,
    /// Microseconds to open a connection, plus one; 0 when one was reused.
    pub connect_us: AtomicU64,
    /// Microseconds to the upstream's response head, plus one; 0 without one.
    pub header_us: AtomicU64,
    /// Request body bytes read from the client and sent on.
    pub bytes_in: Arc<AtomicU64>,
}

impl UpstreamTiming {
    pub fn set_connect(&self, d: Duration) {
        self.connect_us.store(d.as_micros() as u64 + 1, Relaxed);
    }

    pub fn set_header(&self, d: Duration, endpoint: &str) {
        self.header_us.store(d.as_micros() as u64 + 1, Relaxed);
        *self.endpoint.lock().expect("timing lock") = Some(endpoint.to_owned());
    }
}

/// One request's access log line, waiting for its response body to end.
/// (`Clone` only because response extensions require it; it is moved.)
#[derive(Debug, Clone)]
pub struct AccessLine {
    pub format: AccessLogFormat,
    pub time: SystemTime,
    pub client: String,
    pub method: Method,
    pub path: String,
    pub version: Version,
    pub route: String,
    pub status: u16,
    pub upstream: Option<String>,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
    /// The header's bytes as sent (at most [`MAX_VALUE`]): the combined
    /// format escapes each byte beyond ASCII as it came.
    pub user_agent: Option<Vec<u8>>,
    pub referer: Option<Vec<u8>>,
    /// The user the route's `auth` accepted, when one is known.
    pub user: Option<Arc<str>>,
    /// Time to the response head.
    pub duration: Duration,
    pub timing: Option<Arc<UpstreamTiming>>,
    /// Response body bytes sent, counted by the connection.
    pub bytes_out: u64,
    /// The start of the request, for the total time.
    pub started: tokio::time::Instant,
}

fn ms(us_plus_one: u64) -> Option<f64> {
    (us_plus_one != 0).then(|| (us_plus_one - 1) as f64 / 1000.0)
}

impl AccessLine {
    /// Writes the line (the response body is done).
    pub fn write(&self) {
        let total = self.started.elapsed();
        let timing = self.timing.as_deref();
        let bytes_in = timing.map_or(0, |t| t.bytes_in.load(Relaxed));
        let endpoint = timing.and_then(|t| t.endpoint.lock().expect("timing lock").clone());
        let connect_ms = timing.and_then(|t| ms(t.connect_us.load(Relaxed)));
        let header_ms = timing.and_then(|t| ms(t.header_us.load(Relaxed)));
        let user_agent = self.user_agent.as_deref().map(String::from_utf8_lossy);
        match self.format {
            AccessLogFormat::Json if !JSON_LOGS.load(Relaxed) => {
                let mut object = serde_json::json!({
                    "request_id": self.request_id,
                    "trace_id": self.trace_id,
                    "client": self.client,
                    "method": self.method.as_str(),
                    "path": self.path,
                    "route": self.route,
                    "status": self.status,
                    "bytes_in": bytes_in,
                    "bytes_out": self.bytes_out,
                    "duration_ms": self.duration.as_secs_f64() * 1000.0,
                    "total_ms": total.as_secs_f64() * 1000.0,
                    "upstream": self.upstream,
                    "upstream_endpoint": endpoint,
                    "upstream_connect_ms": connect_ms,
                    "upstream_header_ms": header_ms,
                    "user_agent": user_agent,
                    "user": self.user.as_deref(),
                });
                // As the JSON logs' fields: one left out when it has no value.
                if let Some(fields) = object.as_object_mut() {
                    fields.retain(|_, v| !v.is_null());
                }
                tracing::info!(target: "access", "{object}")
            }
            AccessLogFormat::Json => tracing::info!(
                target: "access",
                request_id = self.request_id.as_deref(),
                trace_id = self.trace_id.as_deref(),
                client = %self.client,
                method = %self.method,
                path = %self.path,
                route = %self.route,
                status = self.status,
                bytes_in,
                bytes_out = self.bytes_out,
                duration_ms = self.duration.as_secs_f64() * 1000.0,
                total_ms = total.as_secs_f64() * 1000.0,
                upstream = self.upstream.as_deref(),
                upstream_endpoint = endpoint.as_deref(),
                upstream_connect_ms = connect_ms,
                upstream_header_ms = header_ms,
                user_agent = user_agent.as_deref(),
                user = self.user.as_deref(),
            ),
            AccessLogFormat::Combined => tracing::info!(target: "access", "{}", self.combined(total)),
        }
    }

    /// `client - user [time] "METHOD path HTTP/x" status bytes "referer" "agent"
    /// seconds request_id`.
    fn combined(&self, total: Duration) -> String {
        let time = apache_time(self.time);
        fn quote<T: AsRef<[u8]>>(v: &Option<T>) -> Cow<'_, str> {
            v.as_ref().map_or(Cow::Borrowed("-"), |v| escape(v.as_ref()))
        }
        format!(
            "{} - {} [{time}] \"{} {} {:?}\" {} {} \"{}\" \"{}\" {:.3} {}",
            self.client,
            self.user.as_deref().map_or(Cow::Borrowed("-"), |u| escape(u.as_bytes())),
            escape(self.method.as_str().as_bytes()),
            escape(self.path.as_bytes()),
            self.version,
            self.status,
            self.bytes_out,
            quote(&self.referer),
            quote(&self.user_agent),
            total.as_secs_f64(),
            quote(&self.request_id),
        )
    }
}

/// A value for the combined format, escaped as nginx escapes it: `"`, `\`
/// and bytes outside printable ASCII become `\xHH`, so a value cannot end
/// its quotes or forge a line.
fn escape(v: &[u8]) -> Cow<'_, str> {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if v.iter().copied().all(plain) {
        // Printable ASCII only: UTF-8.
        return String::from_utf8_lossy(v);
    }
    let mut out = String::with_capacity(v.len() + 8);
    for &b in v {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    Cow::Owned(out)
}

/// `14/Nov/2023:22:13:20 +0000`, as the combined format writes time,
/// rearranged from httpdate's RFC 9110 form (always GMT).
fn apache_time(t: SystemTime) -> String {
    let http = httpdate::fmt_http_date(t); // "Tue, 14 Nov 2023 22:13:20 GMT"
    let parts: Vec<&str> = http.split(' ').collect();
    match parts[..] {
        [_, day, month, year, clock, _] => format!("{day}/{month}/{year}:{clock} +0000"),
        _ => http,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_table() {
        for (raw, want) in [
            ("plain /a?b=c", "plain /a?b=c"),
            ("say \"hi\"", "say \\x22hi\\x22"),
            ("back\\slash", "back\\x5Cslash"),
            ("line\nbreak\tand\x7f", "line\\x0Abreak\\x09and\\x7F"),
            ("caf\u{e9}", "caf\\xC3\\xA9"),
        ] {
            assert_eq!(escape(raw.as_bytes()), want, "{raw:?}");
        }
    }

    /// A client's value is kept to `MAX_VALUE` bytes, shorter ones whole.
    #[test]
    fn a_value_is_kept_to_its_bound() {
        assert_eq!(kept(&[b'a'; 60_000]).len(), MAX_VALUE);
        assert_eq!(kept(b"curl/8"), b"curl/8");
        assert_eq!(escape(kept(&[0xFF; 60_000])).len(), MAX_VALUE * 4, "each byte as \\xHH");
    }

    #[test]
    fn combined_format() {
        let line = AccessLine {
            format: AccessLogFormat::Combined,
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            client: "10.0.0.1".into(),
            method: Method::GET,
            path: "/b?x=1".into(),
            version: Version::HTTP_11,
            route: "b".into(),
            status: 200,
            upstream: None,
            request_id: Some("ab\"c".into()),
            trace_id: None,
            user_agent: Some(b"curl/8 \"quoted\" \xFF".to_vec()),
            referer: None,
            user: Some("ann".into()),
            duration: Duration::from_millis(12),
            timing: None,
            bytes_out: 42,
            started: tokio::time::Instant::now(),
        };
        let text = line.combined(Duration::from_millis(1500));
        assert_eq!(
            text,
            "10.0.0.1 - ann [14/Nov/2023:22:13:20 +0000] \"GET /b?x=1 HTTP/1.1\" 200 42 \"-\" \"curl/8 \\x22quoted\\x22 \\xFF\" 1.500 ab\\x22c"
        );
    }
}
