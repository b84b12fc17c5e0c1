//! What the admin listener and the configuration reveal or accept, end to
//! end: `/-/config` hides secrets under names outside its first list (a
//! bare JWT anywhere, `X-Pwd`, `?pass=` in a health path).

mod common;

use common::*;

/// `/-/config` redacts a JWT under any name, values under names that hold
/// `pass`, `pwd`, `secret`, `token`, `key` or `auth`, and such query
/// parameters in a health check's path; before, `X-JWT-Assertion`,
/// `X-Pwd` and `?pass=` were shown as written.
#[tokio::test]
async fn config_hides_secrets_under_names_outside_its_first_list() {
    let up = TestUpstream::start(|_req| async { http::Response::new(full("ok")) }).await;
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJTRUNSRVQtSldUIn0.U0VDUkVULVNJRw";
    let toml = format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [upstreams.app]\nurl = \"http://{}\"\n\
         [upstreams.app.health]\npath = \"/health?pass=SECRET-PASS&v=1\"\ninterval = \"1h\"\n\
         [[routes]]\nname = \"app\"\nprefix = \"/app\"\nupstream = \"app\"\n\
         request_headers = {{ set = {{ \"X-JWT-Assertion\" = \"{jwt}\", \"X-Forwarded-Assertion\" = \"{jwt}\", \
         \"X-Pwd\" = \"SECRET-PWD\", \"X-Passphrase\" = \"SECRET-PHRASE\", \"X-Env\" = \"prod\" }} }}\n",
        up.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    let (parts, body) = get(&format!("http://{}/-/config", gw.admin.unwrap())).await;
    assert_eq!(parts.status, 200);
    let text = String::from_utf8_lossy(&body);
    for secret in [jwt, "SECRET-PASS", "SECRET-PWD", "SECRET-PHRASE"] {
        assert!(!text.contains(secret), "{secret} shown: {text}");
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["upstreams"]["app"]["health"]["path"], "/health?pass=<redacted>&v=1", "{v}");
    assert_eq!(v["routes"][0]["request_headers"]["set"]["X-Env"], "prod", "{v}");
    assert_eq!(v["routes"][0]["request_headers"]["set"]["X-JWT-Assertion"], "<redacted>", "{v}");
}

/// Upstream names are held to the rule route names are (letters, digits,
/// `_`, `-`, `.`): they become metric labels, log fields and keys of
/// `/-/upstreams` and the status page. Before, any TOML key was taken.
#[test]
fn upstream_names_are_checked_as_route_names_are() {
    let toml = |name: &str| {
        format!(
            "[upstreams.{name}]\nurl = \"http://127.0.0.1:9\"\n\
             [[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = {name}\n"
        )
    };
    let cases: Vec<(String, &str)> = ["\"a b\"", "\"<img src=x onerror=alert(1)>\"", "\"\"", "\"x\\ny\"", "\"é\""]
        .iter()
        .map(|n| (toml(n), "use letters, digits, '_', '-' or '.'"))
        .collect();
    let cases: Vec<(&str, &str)> = cases.iter().map(|(t, k)| (t.as_str(), *k)).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, toml("\"app-1.v2_b\"")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway")).args(["check", "--config"]).arg(&path).output();
    assert!(out.unwrap().status.success());
}
