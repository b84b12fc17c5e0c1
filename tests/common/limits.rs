//! Helpers for the rate-limit tests: a GET with headers, a metric's value,
//! and a route whose limit is shared through Redis.

use bytes::Bytes;
use http::Request;

use super::{full, sample, send};

/// A GET with `headers`: the status and the response headers.
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap) {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let (parts, _) = send(req.body(full(Bytes::new())).unwrap()).await;
    (parts.status.as_u16(), parts.headers)
}

/// The sample of `name` with `labels` in the metrics `text`, or 0.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or(0.0)
}

/// A gateway answering 200 on route `route`, limited by `limit` (the
/// inside of `rate_limit = { ... }`) shared through the Redis at `redis`;
/// `store` is the rest of `[rate_limit_store]`.
pub fn shared_toml(route: &str, limit: &str, redis: &str, store: &str) -> String {
    format!(
        "[server]\n[[routes]]\nname = \"{route}\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ {limit}, shared = \"redis\" }}\n\
         [rate_limit_store]\nurl = \"{redis}\"\n{store}\n"
    )
}
