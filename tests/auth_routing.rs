//! Routing and the headers auth sets: a split's sticky key reads the header
//! the route's auth set, never the client's own copy, and a route cannot be
//! chosen by a header some route's auth sets (it is chosen before auth).

mod common;

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

/// An upstream that answers with its name.
async fn named(name: &'static str) -> TestUpstream {
    TestUpstream::start(move |_req: Request<Incoming>| async move { Response::new(full(name)) }).await
}

/// Before, the split was chosen before auth from the client's `X-User`:
/// one user (the auth service says `ann`) picked a version by sending
/// `X-User` values of their own, while the upstream got `x-user: ann`.
#[tokio::test]
async fn a_sticky_split_reads_the_user_auth_set_not_the_clients() {
    let (v1, v2) = (named("v1").await, named("v2").await);
    let auth = TestUpstream::start(|_req: Request<Incoming>| async move {
        Response::builder().header("x-user", "ann").body(full("")).unwrap()
    })
    .await;
    let toml = format!(
        "[upstreams.v1]\nurl = \"http://{}\"\n[upstreams.v2]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"canary\"\nprefix = \"/\"\n\
         split = [{{ upstream = \"v1\", weight = 1 }}, {{ upstream = \"v2\", weight = 1 }}]\n\
         sticky = \"header:x-user\"\n\
         auth = {{ forward = {{ url = \"http://{}/verify\", response_headers = [\"x-user\"] }} }}\n",
        v1.addr, v2.addr, auth.addr
    );
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let mut landed = std::collections::BTreeMap::new();
    for i in 0..24 {
        let req = Request::get(gw.url("/page")).header("x-user", format!("picked-{i}"));
        let (parts, body) = send(req.body(full("")).unwrap()).await;
        assert_eq!(parts.status, 200);
        *landed.entry(String::from_utf8_lossy(&body).into_owned()).or_insert(0) += 1;
    }
    assert_eq!(landed.len(), 1, "one user, one version: {landed:?}");
}

#[test]
fn a_route_chosen_by_a_header_auth_sets_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let forward = "auth = { forward = { url = \"http://127.0.0.1:1/\", response_headers = [\"x-groups\"] } }";
    let jwt = "auth = { jwt = { jwks_url = \"http://127.0.0.1:1/jwks\", algorithms = [\"RS256\"], forward_claims = { \"x-groups\" = \"groups\" } } }";
    for (auth, condition) in [(forward, "\"x-groups\" = \"admin\""), (jwt, "\"X_Groups\" = \"admin\"")] {
        let toml = format!(
            "[upstreams.a]\nurl = \"http://127.0.0.1:2\"\n\
             [[routes]]\nname = \"admin\"\nprefix = \"/adm\"\nupstream = \"a\"\nheaders = {{ {condition} }}\n{auth}\n\
             [[routes]]\nname = \"users\"\nprefix = \"/adm\"\nupstream = \"a\"\n{auth}\n"
        );
        let e = gateway::config::load(&gateway::config::Source::Inline { text: toml, base_dir: dir.path().into() })
            .expect_err(condition);
        let e = e.to_string();
        assert!(e.contains("routes[0].headers.x") && e.contains("chosen before auth"), "{condition}: {e}");
    }
}
