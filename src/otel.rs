//! Span export (`[tracing] otlp_endpoint`): one span per request, with the
//! OpenTelemetry HTTP semantic-convention attributes, posted in batches as
//! OTLP/HTTP JSON to `{otlp_endpoint}/v1/traces`.
//!
//! A request never waits for it: spans go into a bounded channel with
//! `try_send` (a full channel drops the span and counts it), and one task
//! batches and posts them. An unreachable collector costs a counter
//! (`gateway_trace_export_failures_total`) and a warning at most once a
//! minute. At shutdown the spans still queued are posted (bounded by the
//! post timeout) before the process exits.
//!
//! The wire types are `opentelemetry-proto`'s (with its serde support for
//! the OTLP JSON mapping); the batching is this module's own rather than the
//! OpenTelemetry SDK's batch processor, which runs on a thread of its own
//! with a blocking executor and would need a second HTTP client stack
//! (reqwest) beside the hyper client the gateway already runs on tokio.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics::counter;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::TracingConfig;
use crate::layers::trace::TraceContext;
use crate::metrics::{TRACE_EXPORT_FAILURES, TRACE_SPANS_DROPPED};

/// Spans waiting to be posted before new ones are dropped.
const QUEUE: usize = 8192;
/// Spans per post, at most.
const BATCH: usize = 512;
/// The longest a span waits for its batch.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The longest a post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// One request, as the exporter needs it.
pub struct RequestSpan<'a> {
    pub trace: &'a TraceContext,
    pub start: SystemTime,
    pub end: SystemTime,
    pub method: &'a Method,
    pub route: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub host: Option<&'a str>,
    pub client: &'a str,
    pub request_id: Option<&'a str>,
    pub upstream: Option<&'a str>,
}

/// The exporter's sending end.
pub struct Exporter {
    tx: mpsc::Sender<Span>,
    /// Tells the task to post what is queued and end.
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Exporter {
    /// Starts the export task (on the current runtime).
    pub fn start(config: &TracingConfig) -> Option<Exporter> {
        let base = config.otlp_endpoint.as_ref()?;
        let url = format!("{}/v1/traces", base.trim_end_matches('/'));
        let (tx, rx) = mpsc::channel(QUEUE);
        let stop = CancellationToken::new();
        let task = tokio::spawn(post_batches(rx, url, config.service_name.clone(), stop.clone()));
        Some(Exporter { tx, stop, task: Mutex::new(Some(task)) })
    }

    /// Posts the spans still queued and stops the export (at shutdown, once
    /// the requests have drained). Spans recorded after it are dropped.
    pub async fn flush(&self) {
        self.stop.cancel();
        let task = self.task.lock().expect("exporter lock").take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(POST_TIMEOUT + Duration::from_secs(1), task).await;
        }
    }

    /// Queues the span of a finished request; never waits.
    pub fn record(&self, r: RequestSpan<'_>) {
        if self.tx.try_send(span(r)).is_err() {
            counter!(TRACE_SPANS_DROPPED).increment(1);
        }
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
}

fn text(key: &str, value: &str) -> KeyValue {
    attr(key, any_value::Value::StringValue(value.to_owned()))
}

/// The bytes of a client's path or host a span keeps: up to [`QUEUE`]
/// spans wait in memory, and a head may be as long as `max_header_size`.
const MAX_TEXT: usize = 1024;

/// `s`, cut to at most `MAX_TEXT` bytes on a character boundary, and
/// before a percent-escape the cut would split (`%C3%A9%C`).
fn bounded(s: &str) -> &str {
    if s.len() <= MAX_TEXT {
        return s;
    }
    let mut end = s.floor_char_boundary(MAX_TEXT);
    if let Some(percent) = s[end.saturating_sub(2)..end].rfind('%') {
        end = end.saturating_sub(2) + percent;
    }
    &s[..end]
}

/// The OTLP span of a request (a server span, named `METHOD route`; a
/// method outside HTTP's own is `_OTHER`, and the span `HTTP route`, as the
/// semantic conventions say: a client's method is neither kept nor a name).
fn span(r: RequestSpan<'_>) -> Span {
    let method = Some(crate::metrics::method_label(r.method)).filter(|m| *m != "other");
    let mut attributes = vec![
        text("http.request.method", method.unwrap_or("_OTHER")),
        text("http.route", r.route),
        attr("http.response.status_code", any_value::Value::IntValue(i64::from(r.status))),
        text("url.path", bounded(r.path.split('?').next().unwrap_or("/"))),
        text("client.address", r.client),
    ];
    if let Some(host) = r.host {
        let (address, port) = host.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).unwrap_or((host, ""));
        attributes.push(text("server.address", bounded(address)));
        if let Ok(port) = port.parse::<i64>() {
            attributes.push(attr("server.port", any_value::Value::IntValue(port)));
        }
    }
    if let Some(id) = r.request_id {
        attributes.push(text("gateway.request_id", id));
    }
    if let Some(upstream) = r.upstream {
        attributes.push(text("gateway.upstream", upstream));
    }
    // Server spans: 5xx are errors, 4xx are the client's (semantic conventions).
    let code = if r.status >= 500 { status::StatusCode::Error } else { status::StatusCode::Unset };
    Span {
        trace_id: r.trace.trace_id.to_be_bytes().to_vec(),
        span_id: r.trace.span_id.to_be_bytes().to_vec(),
        parent_span_id: r.trace.parent_id.map(|p| p.to_be_bytes().to_vec()).unwrap_or_default(),
        flags: u32::from(r.trace.flags),
        name: format!("{} {}", method.unwrap_or("HTTP"), r.route),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: nanos(r.start),
        end_time_unix_nano: nanos(r.end),
        attributes,
        status: Some(Status { code: code as i32, message: String::new() }),
        ..Span::default()
    }
}

/// The export task: batches spans and posts them; ends with the channel,
/// or at `stop` once what is queued has been posted.
async fn post_batches(mut rx: mpsc::Receiver<Span>, url: String, service: String, stop: CancellationToken) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut last_warning: Option<tokio::time::Instant> = None;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if stop.is_cancelled() {
            // The last posts: whatever is queued, without waiting for more.
            while batch.len() < BATCH
                && let Ok(span) = rx.try_recv()
            {
                batch.push(span);
            }
            if batch.is_empty() {
                return;
            }
        } else {
            let first = tokio::select! {
                first = rx.recv() => first,
                () = stop.cancelled() => continue,
            };
            let Some(first) = first else { return };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + FLUSH_EVERY;
            while batch.len() < BATCH {
                tokio::select! {
                    next = tokio::time::timeout_at(deadline, rx.recv()) => match next {
                        Ok(Some(span)) => batch.push(span),
                        Ok(None) | Err(_) => break,
                    },
                    () = stop.cancelled() => break,
                }
            }
        }
        let body = payload(&service, std::mem::take(&mut batch));
        let request = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid export request");
        let outcome = tokio::time::timeout(POST_TIMEOUT, client.request(request)).await;
        let failure = match outcome {
            Ok(Ok(response)) if response.status().is_success() => None,
            Ok(Ok(response)) => Some(format!("collector answered {}", response.status())),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {}", humantime::format_duration(POST_TIMEOUT))),
        };
        if let Some(failure) = failure {
            counter!(TRACE_EXPORT_FAILURES).increment(1);
            if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(url = %url, error = %failure, "span export failed; spans dropped (warned at most once a minute)");
                last_warning = Some(tokio::time::Instant::now());
            }
        }
    }
}

fn payload(service: &str, spans: Vec<Span>) -> Vec<u8> {
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![text("service.name", service)], ..Resource::default() }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "gateway".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    serde_json::to_vec(&request).expect("spans serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(span: &Span, key: &str) -> String {
        let kv = span.attributes.iter().find(|kv| kv.key == key).expect(key);
        match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => s.clone(),
            other => panic!("{key}: {other:?}"),
        }
    }

    /// What a client sends is bounded in a span: a method of its own is
    /// `_OTHER` (the name `HTTP route`), a path or host is cut; HTTP's
    /// methods and short values are kept as they are.
    #[test]
    fn a_span_keeps_no_unbounded_client_text() {
        let trace = TraceContext::root();
        let long = "é".repeat(40_000);
        let cases = [
            (Method::GET, "/a", "h.example", "GET r", "GET", "/a", "h.example"),
            (Method::from_bytes(&[b'M'; 60_000]).unwrap(), "/a", "h", "HTTP r", "_OTHER", "/a", "h"),
        ];
        for (method, path, host, name, m, want_path, want_host) in cases {
            let r = RequestSpan {
                trace: &trace,
                start: SystemTime::now(),
                end: SystemTime::now(),
                method: &method,
                route: "r",
                path,
                status: 200,
                host: Some(host),
                client: "10.0.0.1",
                request_id: None,
                upstream: None,
            };
            let s = span(r);
            assert_eq!((s.name.as_str(), attribute(&s, "http.request.method").as_str()), (name, m));
            assert_eq!(
                (attribute(&s, "url.path"), attribute(&s, "server.address")),
                (want_path.into(), want_host.into())
            );
        }
        // Percent-escapes are not split: the cut falls before one.
        let escaped = format!("/{}", "%C3%A9".repeat(400));
        for shift in 0..3 {
            let path = format!("{}{escaped}", "a".repeat(shift));
            let kept = bounded(&path);
            assert!(kept.len() <= MAX_TEXT && kept.len() >= MAX_TEXT - 2, "{}", kept.len());
            assert!((kept.len() - 1 - shift).is_multiple_of(3), "{shift}: {}", &kept[kept.len() - 4..]);
        }
        let path = format!("/{long}");
        let r = RequestSpan {
            trace: &trace,
            start: SystemTime::now(),
            end: SystemTime::now(),
            method: &Method::GET,
            route: "r",
            path: &path,
            status: 200,
            host: Some(&long),
            client: "10.0.0.1",
            request_id: None,
            upstream: None,
        };
        let s = span(r);
        let (p, h) = (attribute(&s, "url.path"), attribute(&s, "server.address"));
        assert!(p.len() <= MAX_TEXT && p.len() > MAX_TEXT - 4 && path.starts_with(&p), "{}", p.len());
        assert!(h.len() <= MAX_TEXT && long.starts_with(&h), "{}", h.len());
    }
}
