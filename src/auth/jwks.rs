//! The keys a JWT route verifies with, by `kid`: from a file (fixed until a
//! reload) or from a URL, fetched at start and again every `refresh` (or as
//! its `Cache-Control: max-age` says), keeping the last good keys when a
//! fetch fails. A token naming an unknown `kid` makes one fetch at once,
//! at most every [`MIN_REFETCH`], so a rotated key is picked up without
//! letting made-up `kid`s hammer the key server. Until the first fetch
//! succeeds, requests get 503. A fetch that brings the same set keeps the
//! keys as they were: tokens remembered as verified with them
//! (`jwt_cache`) stay so until the set changes.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use metrics::Counter;
use tokio::time::Instant;

use crate::config::access::parse_fetched_jwks;

/// Keys by `kid`, each with the `alg` its JWK pins it to, if any.
pub type Keys = HashMap<String, (DecodingKey, Option<String>)>;

/// Fetches for an unknown `kid` happen at most this often.
pub const MIN_REFETCH: Duration = Duration::from_secs(10);
/// A `max-age` shorter than this is read as this.
const MIN_MAX_AGE: Duration = Duration::from_secs(10);
/// A failed fetch is tried again after this (or `refresh`, if shorter).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
/// A fetch (connect, TLS, answer) takes at most this.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest JWKS read.
const MAX_JWKS: usize = 1024 * 1024;

/// A route's key set.
pub struct Jwks {
    keys: ArcSwapOption<Keys>,
    remote: Option<Remote>,
    /// Ends the refresh task when the set is dropped (a reload replaced
    /// it), rather than when its sleep of up to `refresh` next ends: each
    /// reload would leave one behind for that long.
    _stop: Option<tokio_util::sync::DropGuard>,
}

struct Remote {
    url: Uri,
    /// `url` as logs show it: redacted as `/-/config` shows it (a token in
    /// its query is a secret).
    shown: String,
    refresh: Duration,
    algorithms: Vec<Algorithm>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// One fetch at a time; when the last one for an unknown `kid` began.
    refetched: tokio::sync::Mutex<Option<Instant>>,
    ok: Counter,
    failed: Counter,
    /// Why keys of the last fetched set were skipped, to log it once per change.
    skipped: std::sync::Mutex<String>,
    /// The set the current keys were made from.
    fetched: std::sync::Mutex<Option<JwkSet>>,
    /// When the last fetch began (this set's or, kept over a reload, the
    /// set's before it).
    last_fetch: std::sync::Mutex<Option<Instant>>,
}

/// The keys of a checked set.
pub fn keys_of(set: &JwkSet) -> Keys {
    set.keys
        .iter()
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some((kid, (key, jwk.common.key_algorithm.map(|a| format!("{a:?}")))))
        })
        .collect()
}

impl Jwks {
    pub fn fixed(set: &JwkSet) -> Arc<Jwks> {
        Arc::new(Jwks { keys: ArcSwapOption::from_pointee(keys_of(set)), remote: None, _stop: None })
    }

    /// Starts fetching `url` (in a task that ends when the set is dropped).
    /// `previous`: the running route's set, whose last good keys are used
    /// meanwhile when it fetched the same URL (a reload must not leave the
    /// route without keys, for good if the key server is down then).
    pub fn remote(url: &Uri, refresh: Duration, algorithms: &[Algorithm], previous: Option<&Jwks>) -> Arc<Jwks> {
        let tls = (url.scheme_str() == Some("https"))
            .then(|| crate::tls::client_config(None, None, &[b"http/1.1"]).ok())
            .flatten();
        let counter = |result| metrics::counter!(crate::metrics::AUTH_JWKS_REFRESH, "result" => result);
        let remote = Remote {
            url: url.clone(),
            shown: crate::config::redact_url(&url.to_string()),
            refresh,
            algorithms: algorithms.to_vec(),
            tls,
            refetched: tokio::sync::Mutex::new(None),
            ok: counter("ok"),
            failed: counter("error"),
            skipped: std::sync::Mutex::new(String::new()),
            fetched: std::sync::Mutex::new(None),
            last_fetch: std::sync::Mutex::new(None),
        };
        let kept = previous.and_then(|p| Some((p, p.remote.as_ref().filter(|r| r.url == *url)?)));
        let last = kept.and_then(|(_, r)| *r.last_fetch.lock().unwrap_or_else(|e| e.into_inner()));
        *remote.last_fetch.lock().unwrap_or_else(|e| e.into_inner()) = last;
        let keys = kept.and_then(|(p, r)| {
            let keys = p.current()?;
            if r.algorithms == algorithms {
                // The same set fetched again changes nothing (see `fetch`).
                *remote.fetched.lock().unwrap_or_else(|e| e.into_inner()) = r.fetched_set();
                *remote.skipped.lock().unwrap_or_else(|e| e.into_inner()) = r.skipped_keys();
                return Some(keys);
            }
            Some(Arc::new(keys_for(&keys, algorithms)))
        });
        // Keys kept from the running set of the same URL are fetched again
        // [`MIN_REFETCH`] (or `refresh`, if shorter) after the last set's
        // last fetch, not at once: a storm of reloads would otherwise fetch
        // once each; and not a fixed wait from the reload, which reloads
        // closer together than it would put off for ever.
        let spacing = MIN_REFETCH.min(refresh);
        let first = match (&keys, last) {
            (Some(_), Some(last)) => (last + spacing).saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let jwks = Arc::new(Jwks {
            keys: ArcSwapOption::new(keys),
            remote: Some(remote),
            _stop: Some(stop.clone().drop_guard()),
        });
        tokio::spawn(refresh_loop(Arc::downgrade(&jwks), first, stop));
        jwks
    }

    /// The keys as of now; `None` until a URL's first fetch succeeds.
    pub fn current(&self) -> Option<Arc<Keys>> {
        self.keys.load_full()
    }

    /// A token named a `kid` the keys lack: fetch again, unless that was
    /// done within [`MIN_REFETCH`]. The keys after it.
    pub async fn refetch(&self) -> Option<Arc<Keys>> {
        let Some(remote) = &self.remote else { return self.current() };
        let mut last = remote.refetched.lock().await;
        if last.is_some_and(|at| at.elapsed() < MIN_REFETCH) {
            return self.current();
        }
        *last = Some(Instant::now());
        self.fetch(remote).await;
        self.current()
    }

    /// One fetch; how long until the next.
    async fn fetch(&self, remote: &Remote) -> Duration {
        *remote.last_fetch.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        match tokio::time::timeout(FETCH_TIMEOUT, get(remote)).await.unwrap_or_else(|_| Err("timed out".into())) {
            Ok((set, max_age)) => {
                remote.ok.increment(1);
                tracing::debug!(url = %remote.shown, keys = set.keys.len(), "JWKS fetched");
                let mut fetched = remote.fetched.lock().unwrap_or_else(|e| e.into_inner());
                if fetched.as_ref() != Some(&set) {
                    self.keys.store(Some(Arc::new(keys_of(&set))));
                    *fetched = Some(set);
                }
                // `refresh` is the longest the operator lets keys go
                // unchecked (a revoked key stays trusted until then), so a
                // long max-age does not stretch it.
                max_age.map_or(remote.refresh, |age| age.max(MIN_MAX_AGE).min(remote.refresh))
            }
            Err(e) => {
                remote.failed.increment(1);
                let kept = if self.current().is_some() { "keeping the last good keys" } else { "no keys yet: 503" };
                tracing::warn!(url = %remote.shown, error = %e, "JWKS fetch failed; {kept}");
                remote.refresh.min(RETRY_AFTER_FAILURE)
            }
        }
    }
}

impl Remote {
    fn fetched_set(&self) -> Option<JwkSet> {
        self.fetched.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn skipped_keys(&self) -> String {
        self.skipped.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Of `keys`, those a route accepting `algorithms` uses: a key whose JWK
/// pins another algorithm is left out, as [`parse_fetched_jwks`] does.
fn keys_for(keys: &Keys, algorithms: &[Algorithm]) -> Keys {
    let listed = |pinned: &String| algorithms.iter().any(|a| format!("{a:?}") == *pinned);
    keys.iter()
        .filter(|(_, (_, pinned))| pinned.as_ref().is_none_or(listed))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn refresh_loop(jwks: Weak<Jwks>, first: Duration, stop: tokio_util::sync::CancellationToken) {
    let mut wait = first;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        let Some(j) = jwks.upgrade() else { return };
        let Some(remote) = &j.remote else { return };
        wait = j.fetch(remote).await;
    }
}

/// `GET url` on a connection of its own: the set, checked, and its max-age.
async fn get(remote: &Remote) -> Result<(JwkSet, Option<Duration>), String> {
    let authority = remote.url.authority().ok_or("no host")?;
    let tls = remote.tls.as_ref();
    let port = authority.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
    // An IPv6 literal without its brackets, as an address to connect to.
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| e.to_string())?;
    let path = remote.url.path_and_query().map_or("/", |pq| pq.as_str());
    let request = Request::get(path)
        .header(header::HOST, authority.as_str())
        .header(header::ACCEPT, "application/json")
        .header(header::USER_AGENT, "gateway-jwks")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = match tls {
        Some(config) => {
            let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
            let stream = tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp).await;
            send(TokioIo::new(stream.map_err(|e| e.to_string())?), request).await?
        }
        None => send(TokioIo::new(tcp), request).await?,
    };
    if !response.status().is_success() {
        return Err(format!("answered {}", response.status()));
    }
    let max_age = response.headers().get(header::CACHE_CONTROL).and_then(|v| max_age(v.to_str().ok()?));
    let body = Limited::new(response.into_body(), MAX_JWKS).collect().await.map_err(|e| e.to_string())?.to_bytes();
    let text = std::str::from_utf8(&body).map_err(|_| "not UTF-8".to_owned())?;
    let (set, skipped) = parse_fetched_jwks(text, &remote.algorithms)?;
    let skipped = skipped.join("; ");
    let mut last = remote.skipped.lock().unwrap_or_else(|e| e.into_inner());
    if *last != skipped {
        if !skipped.is_empty() {
            tracing::warn!(url = %remote.shown, skipped = %skipped, "JWKS keys skipped; the others are used");
        }
        *last = skipped;
    }
    Ok((set, max_age))
}

async fn send<I>(io: I, request: Request<Empty<Bytes>>) -> Result<http::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    sender.send_request(request).await.map_err(|e| e.to_string())
}

/// `max-age=N` of a `Cache-Control` value (RFC 9111 §5.2.2.1).
fn max_age(value: &str) -> Option<Duration> {
    value
        .split(',')
        .find_map(|d| d.trim().strip_prefix("max-age=")?.trim_matches('"').parse().ok())
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set a reload replaced ends its refresh task then, not when the
    /// task's sleep (up to `refresh`, here a day) next ends; and a set
    /// that kept the last one's keys does not fetch at once.
    #[tokio::test]
    async fn a_dropped_set_ends_its_refresh_task() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url: Uri = format!("http://{}/jwks", listener.local_addr().unwrap()).parse().unwrap();
        drop(listener);
        let tasks = tokio::runtime::Handle::current().metrics();
        let before = tasks.num_alive_tasks();
        let sets: Vec<_> =
            (0..20).map(|_| Jwks::remote(&url, Duration::from_secs(86_400), &[Algorithm::RS256], None)).collect();
        // Their first fetches fail (nothing listens), and they sleep.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(tasks.num_alive_tasks(), before + 20);
        drop(sets);
        for _ in 0..100 {
            if tasks.num_alive_tasks() == before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(tasks.num_alive_tasks(), before, "refresh tasks left behind");
    }

    /// Reloads closer together than [`MIN_REFETCH`] neither fetch once each
    /// nor put the next fetch off for ever: it comes `refresh` (here 1 s,
    /// shorter than `MIN_REFETCH`) after the last one, whatever the reloads.
    #[tokio::test]
    async fn reloads_neither_storm_nor_starve_the_fetches() {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let mut n = vec![0x80u8];
        n.extend([0xffu8; 255]);
        let set = format!(r#"{{"keys":[{{"kty":"RSA","kid":"k","n":"{}","e":"AQAB"}}]}}"#, b64(&n));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}/jwks", listener.local_addr().unwrap()).parse().unwrap();
        let fetched = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = fetched.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (set, count) = (set.clone(), count.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{set}", set.len());
                    let _ = tokio::io::AsyncWriteExt::write_all(&mut s, answer.as_bytes()).await;
                });
            }
        });
        let refresh = Duration::from_secs(1);
        let mut running = Jwks::remote(&url, refresh, &[Algorithm::RS256], None);
        while running.current().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A reload every 200 ms for 2.5 s.
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            running = Jwks::remote(&url, refresh, &[Algorithm::RS256], Some(&running));
        }
        let fetches = fetched.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=4).contains(&fetches), "{fetches} fetches in 2.5 s of reloads with refresh = 1s");
    }

    /// An IPv6 literal's host is connected to without its brackets.
    #[tokio::test]
    async fn a_set_at_an_ipv6_literal_is_fetched() {
        let Ok(listener) = tokio::net::TcpListener::bind("[::1]:0").await else { return };
        let addr = listener.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            let body = r#"{"keys":[]}"#;
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            tokio::io::AsyncWriteExt::write_all(&mut s, answer.as_bytes()).await.unwrap();
        });
        let url: Uri = format!("http://[::1]:{}/jwks", addr.port()).parse().unwrap();
        let _set = Jwks::remote(&url, Duration::from_secs(86_400), &[Algorithm::RS256], None);
        tokio::time::timeout(Duration::from_secs(5), served).await.expect("the key server was asked").unwrap();
    }

    #[test]
    fn max_age_of_cache_control() {
        let cases = [
            ("max-age=600", Some(600)),
            ("public, max-age=60, must-revalidate", Some(60)),
            ("max-age=\"30\"", Some(30)),
            ("no-cache", None),
            ("max-age=soon", None),
        ];
        for (value, want) in cases {
            assert_eq!(max_age(value), want.map(Duration::from_secs), "{value}");
        }
    }
}
