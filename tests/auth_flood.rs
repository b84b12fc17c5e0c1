//! A flood of wrong Basic passwords: verifications are bounded
//! process-wide (the rest answered 503 with `Retry-After`), and the proxy
//! keeps answering other routes meanwhile; an overlong password takes no
//! turn at all. Alone in its test binary (beside that one, which verifies
//! nothing), so no other test's verifications share the bound.

mod auth_common;
mod common;

use std::time::{Duration, Instant};

use auth_common::*;
use common::*;

#[tokio::test]
async fn a_flood_of_wrong_passwords_is_bounded_and_other_routes_keep_answering() {
    let dir = tempfile::tempdir().unwrap();
    // Slow enough (in a debug build) that the flood overlaps.
    htpasswd(dir.path(), 9);
    let (up, seen) = recording().await;
    let toml = format!(
        "{}[[routes]]\nname = \"flood_open\"\nprefix = \"/open\"\nrespond = {{ status = 200, body = \"open\" }}\n",
        route(up.addr, "flood", "auth = { basic = { htpasswd = \"users.htpasswd\", realm = \"ops\" } }"),
    );
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let flood: Vec<_> = (0..24)
        .map(|i| {
            let url = gw.url("/flood");
            tokio::spawn(async move {
                let auth = basic("ann", &format!("wrong-{i}"));
                let (parts, _) = get_with(&url, &[("authorization", &auth)]).await;
                (parts.status.as_u16(), header(&parts, "retry-after").map(str::to_owned))
            })
        })
        .collect();
    // Meanwhile the other route answers at once, again and again.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..10 {
        let t = Instant::now();
        let (parts, body) = get(&gw.url("/open")).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"open"[..]));
        assert!(t.elapsed() < Duration::from_millis(500), "the open route waited {:?}", t.elapsed());
    }
    let mut statuses = Vec::new();
    for f in flood {
        statuses.push(f.await.unwrap());
    }
    let busy = statuses.iter().filter(|(s, _)| *s == 503).count();
    assert!(busy > 0, "past the bound some are answered 503: {statuses:?}");
    assert!(statuses.iter().all(|(s, r)| *s == 401 || (*s == 503 && r.as_deref() == Some("1"))), "{statuses:?}");
    assert!(seen.lock().unwrap().is_empty());
    let text = metrics_text(gw.addr).await;
    let errors = sample(&text, "gateway_auth_total", &[("route", "flood"), ("kind", "basic"), ("result", "error")]);
    assert_eq!(errors, Some(busy as f64));
}

/// A password longer than the bound (256 bytes) is refused without
/// hashing: a burst of them never takes a verification turn, so none is
/// answered 503 and none holds the slots correct logins need. SHA-crypt's
/// work grows with the square of the password's length, so one 45,000-byte
/// password for a `$6$` user (or, through the decoy, an unknown one) would
/// hold a slot for seconds.
#[tokio::test]
async fn overlong_passwords_are_refused_without_hashing() {
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 9);
    let (up, seen) = recording().await;
    let toml = route(up.addr, "long", "auth = { basic = { htpasswd = \"users.htpasswd\" } }");
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let users = ["ann", "sam", "sue", "nobody"];
    let burst: Vec<_> = (0..24)
        .map(|i| {
            let url = gw.url("/long");
            let length = if i == 0 { 45_000 } else { 257 + i };
            let auth = basic(users[i % users.len()], &"p".repeat(length));
            tokio::spawn(async move {
                let (parts, _) = get_with(&url, &[("authorization", &auth)]).await;
                (parts.status.as_u16(), header(&parts, "www-authenticate").map(str::to_owned))
            })
        })
        .collect();
    for b in burst {
        let (status, challenge) = b.await.unwrap();
        assert_eq!((status, challenge.as_deref()), (401, Some("Basic realm=\"gateway\", charset=\"UTF-8\"")));
    }
    assert!(seen.lock().unwrap().is_empty());
    let text = metrics_text(gw.addr).await;
    let count =
        |result| sample(&text, "gateway_auth_total", &[("route", "long"), ("kind", "basic"), ("result", result)]);
    assert_eq!((count("denied"), count("error")), (Some(24.0), None));
}
