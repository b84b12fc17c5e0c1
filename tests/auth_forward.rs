//! Forward auth end to end: a test auth service that allows (setting
//! `x-user`), refuses with a login redirect and a cookie, hangs, or is not
//! there at all; the recording upstream sees only what was allowed, and
//! the auth service sees only the listed client headers and the
//! `X-Forwarded-*` ones.

mod auth_common;
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use auth_common::*;
use common::*;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

/// An auth service that records what it is asked: `cookie: session=good`
/// passes with `x-user: ann`; `/hang` never answers in time; anything else
/// is sent to log in.
async fn auth_service() -> (TestUpstream, Arc<Mutex<Vec<(String, HeaderMap)>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let a = asked.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let a = a.clone();
        async move {
            a.lock().unwrap().push((format!("{} {}", req.method(), req.uri()), req.headers().clone()));
            if req.uri().path() == "/hang" {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            if req.uri().path() == "/fail" {
                let failed = Response::builder().status(500).header("x-internal", "stack trace");
                return failed.body(full("Traceback: internal detail")).unwrap();
            }
            let good = req.headers().get("cookie").is_some_and(|c| c.to_str().unwrap().contains("session=good"));
            if good {
                return Response::builder()
                    .header("x-user", "ann")
                    .header("x-other", "kept back")
                    .body(full(""))
                    .unwrap();
            }
            Response::builder()
                .status(302)
                .header("location", "https://login.test/?next=%2Ffwd")
                .header("set-cookie", "next=/fwd; Path=/")
                .header("x-internal", "not for the client")
                .body(full("go and log in"))
                .unwrap()
        }
    })
    .await;
    (up, asked)
}

#[tokio::test]
async fn allowed_refused_hanging_and_missing_auth_services() {
    let (up, seen) = recording().await;
    let (auth, asked) = auth_service().await;
    let down = refused_addr().await;
    let fwd = |url: String, timeout: &str| {
        format!(
            "auth = {{ forward = {{ url = \"{url}\", timeout = \"{timeout}\", request_headers = [\"cookie\"], \
             response_headers = [\"x-user\"] }} }}"
        )
    };
    let toml = format!(
        "{}{}{}",
        route(up.addr, "fwd", &fwd(format!("http://{}/verify", auth.addr), "1s")),
        route(up.addr, "fwd_hang", &fwd(format!("http://{}/hang", auth.addr), "200ms")),
        route(up.addr, "fwd_down", &fwd(format!("http://{down}/verify"), "1s")),
    ) + &route(up.addr, "fwd_fail", &fwd(format!("http://{}/fail", auth.addr), "1s"));
    let gw = TestGateway::from_toml(&toml).await;

    // Allowed: the service's x-user replaces the client's own copies.
    // (Naming x-user in Connection must not strip the service's.)
    let headers = [
        ("cookie", "session=good"),
        ("x-user", "mallory"),
        ("x_user", "eve"),
        ("x-secret", "s3"),
        ("connection", "x-user"),
    ];
    let (parts, body) = get_with(&gw.url("/fwd/page?q=1"), &headers).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"from upstream"[..]));
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].get_all("x-user").iter().collect::<Vec<_>>(), ["ann"]);
        assert!(seen[0].get("x_user").is_none() && seen[0].get("x-other").is_none(), "{:?}", seen[0]);
        assert_eq!(seen[0].get("cookie").unwrap(), "session=good");
        let (line, h) = &asked.lock().unwrap()[0];
        assert_eq!(line, "GET /verify");
        assert_eq!(h.get("x-forwarded-method").unwrap(), "GET");
        assert_eq!(h.get("x-forwarded-uri").unwrap(), "/fwd/page?q=1");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert_eq!(h.get("x-forwarded-host").unwrap(), gw.addr.to_string().as_str());
        assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.1");
        assert_eq!(h.get("cookie").unwrap(), "session=good");
        assert!(h.get("x-secret").is_none() && h.get("x-user").is_none(), "only listed headers: {h:?}");
        // The request's ID: the one the client and the upstream got.
        let id = header(&parts, "x-request-id").expect("an ID");
        assert_eq!(seen[0].get("x-request-id").unwrap(), id);
        assert_eq!(h.get("x-request-id").map(|v| v.to_str().unwrap()), Some(id), "{h:?}");
    }

    // Refused: the service's answer as it is, and the upstream sees nothing.
    let (parts, body) = get_with(&gw.url("/fwd/page"), &[("cookie", "session=bad")]).await;
    assert_eq!(parts.status, 302);
    assert_eq!(header(&parts, "location"), Some("https://login.test/?next=%2Ffwd"));
    assert_eq!(header(&parts, "set-cookie"), Some("next=/fwd; Path=/"));
    assert!(parts.headers.get("x-internal").is_none());
    assert_eq!(&body[..], b"go and log in");

    // Hanging past the timeout, or not there: 503, fail closed.
    let t = Instant::now();
    let (parts, _) = get_with(&gw.url("/fwd_hang"), &[("cookie", "session=good")]).await;
    assert_eq!(parts.status, 503);
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    let (parts, _) = get_with(&gw.url("/fwd_down"), &[("cookie", "session=good")]).await;
    assert_eq!(parts.status, 503);
    // Failing (a 5xx): 503 too, not the service's own answer and body.
    let (parts, body) = get_with(&gw.url("/fwd_fail"), &[("cookie", "session=good")]).await;
    assert_eq!(parts.status, 503);
    assert!(!String::from_utf8_lossy(&body).contains("Traceback") && parts.headers.get("x-internal").is_none());
    assert_eq!(seen.lock().unwrap().len(), 1, "no refused request reached the upstream");

    let text = metrics_text(gw.addr).await;
    let count = |route, result| {
        sample(&text, "gateway_auth_total", &[("route", route), ("kind", "forward"), ("result", result)])
    };
    assert_eq!((count("fwd", "allowed"), count("fwd", "denied")), (Some(1.0), Some(1.0)));
    assert_eq!((count("fwd_hang", "error"), count("fwd_down", "error")), (Some(1.0), Some(1.0)));
    assert_eq!((count("fwd_fail", "error"), count("fwd_fail", "denied")), (Some(1.0), None));
    let asked_count = sample(&text, "gateway_auth_forward_duration_seconds_count", &[("route", "fwd")]);
    assert_eq!(asked_count, Some(2.0));
}

/// A listed request header reaches the upstream only as the service saw
/// it: its underscore spelling, which CGI and WSGI upstreams read as the
/// same variable, is removed, not passed on unasked (a hostile review's
/// `X_Api_Key: victim` beside the `X-Api-Key` the service checked).
#[tokio::test]
async fn a_listed_header_in_another_spelling_does_not_pass_unasked() {
    let (up, seen) = recording().await;
    let (auth, asked) = auth_service().await;
    let forward = format!(
        "auth = {{ forward = {{ url = \"http://{}/verify\", request_headers = [\"cookie\", \"x-api-key\"] }} }}",
        auth.addr
    );
    let gw = TestGateway::from_toml(&route(up.addr, "spelt", &forward)).await;
    let headers = [("cookie", "session=good"), ("x-api-key", "mine"), ("x_api_key", "victim"), ("X_API-key", "v2")];
    let (parts, _) = get_with(&gw.url("/spelt/x"), &headers).await;
    assert_eq!(parts.status, 200);
    let (_, h) = &asked.lock().unwrap()[0];
    assert_eq!(h.get_all("x-api-key").iter().collect::<Vec<_>>(), ["mine"], "{h:?}");
    let got = &seen.lock().unwrap()[0];
    assert_eq!(got.get_all("x-api-key").iter().collect::<Vec<_>>(), ["mine"], "{got:?}");
    assert!(got.get("x_api_key").is_none() && got.get("x_api-key").is_none(), "{got:?}");
}

#[test]
fn forward_auth_urls_are_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for (forward, says) in [
        ("url = 'https://auth.test/verify'", "use an http:// URL"),
        ("url = 'http://user:pw@auth.test/verify'", "credentials in the URL"),
        ("timeout = '1s'", "url: missing"),
        ("url = 'http://auth.test/', response_headers = ['x-forwarded-for']", "set by the gateway"),
    ] {
        let toml = format!(
            "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\nauth = {{ forward = {{ {forward} }} }}\n"
        );
        let e = gateway::config::load(&gateway::config::Source::Inline { text: toml, base_dir: dir.path().into() })
            .expect_err(forward);
        assert!(e.to_string().contains(says), "{forward}: {e}");
    }
}
