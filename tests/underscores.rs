//! Header names that CGI and WSGI upstreams read as one (PEP 3333 maps `-`
//! and `_` to the same `HTTP_` variable): a route's header rules, and the
//! headers the gateway sets by policy, cover every spelling, so a client
//! cannot slip `X_Internal_User` past a rule that sets `x-internal-user`;
//! `server.drop_underscore_headers` drops every name with `_`.

mod common;

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

/// An upstream that answers with the CGI variables its request headers
/// become: `HTTP_NAME=value` lines, sorted, values of one variable joined
/// with `,` as WSGI servers do.
async fn cgi_upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<Incoming>| async move {
        let mut vars: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (name, value) in req.headers() {
            let var = format!("HTTP_{}", name.as_str().to_ascii_uppercase().replace('-', "_"));
            vars.entry(var).or_default().push(value.to_str().unwrap_or("?").to_owned());
        }
        let lines: Vec<String> = vars.into_iter().map(|(k, v)| format!("{k}={}", v.join(","))).collect();
        Response::new(full(lines.join("\n")))
    })
    .await
}

async fn cgi_vars(gw: &TestGateway, path: &str, headers: &[(&str, &str)]) -> Vec<String> {
    let mut req = Request::get(gw.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (parts, body) = send(req.body(full("")).unwrap()).await;
    assert_eq!(parts.status, 200);
    String::from_utf8(body.to_vec()).unwrap().lines().map(str::to_owned).collect()
}

fn var<'a>(vars: &'a [String], name: &str) -> Option<&'a str> {
    vars.iter().find_map(|l| l.strip_prefix(&format!("{name}=")))
}

#[tokio::test]
async fn header_rules_cover_every_spelling_of_a_name() {
    let up = cgi_upstream().await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.us]\nurl = \"http://{}\"\n[[routes]]\nname = \"us\"\nprefix = \"/us\"\nupstream = \"us\"\n\
         request_headers = {{ set = {{ \"x-internal-user\" = \"anonymous\" }}, remove = [\"x-admin\", \"x_secret\"] }}\n",
        up.addr
    ))
    .await;
    let vars = cgi_vars(
        &gw,
        "/us/x",
        &[
            ("X_Internal_User", "root"),
            ("X-Internal_User", "root2"),
            ("X_Admin", "1"),
            ("x-admin", "1"),
            ("x-secret", "s"),
            ("x_keep", "kept"),
        ],
    )
    .await;
    assert_eq!(var(&vars, "HTTP_X_INTERNAL_USER"), Some("anonymous"), "{vars:?}");
    assert_eq!(var(&vars, "HTTP_X_ADMIN"), None, "{vars:?}");
    // A rule spelled with `_` covers the `-` spelling too.
    assert_eq!(var(&vars, "HTTP_X_SECRET"), None, "{vars:?}");
    // Names no rule covers pass, whatever their spelling.
    assert_eq!(var(&vars, "HTTP_X_KEEP"), Some("kept"), "{vars:?}");
}

#[tokio::test]
async fn the_headers_the_gateway_sets_cannot_be_spoofed_with_underscores() {
    let up = cgi_upstream().await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.up_policy]\nurl = \"http://{}\"\n[[routes]]\nname = \"up_policy\"\nprefix = \"/p\"\nupstream = \"up_policy\"\n",
        up.addr
    ))
    .await;
    let vars = cgi_vars(
        &gw,
        "/p/x",
        &[
            ("X_Request_Id", "spoofed"),
            ("X-Forwarded_Proto", "https"),
            ("x_forwarded-host", "evil"),
            ("X_Forwarded_For", "1.2.3.4"),
        ],
    )
    .await;
    let id = var(&vars, "HTTP_X_REQUEST_ID").expect("the gateway's request ID");
    assert!(!id.contains("spoofed") && !id.contains(','), "{vars:?}");
    assert_eq!(var(&vars, "HTTP_X_FORWARDED_PROTO"), Some("http"), "{vars:?}");
    assert!(!var(&vars, "HTTP_X_FORWARDED_HOST").unwrap_or_default().contains("evil"), "{vars:?}");
    assert_eq!(var(&vars, "HTTP_X_FORWARDED_FOR"), Some("127.0.0.1"), "{vars:?}");
}

#[tokio::test]
async fn drop_underscore_headers_drops_every_name_with_an_underscore() {
    let up = cgi_upstream().await;
    let gw = TestGateway::from_toml(&format!(
        "[server]\ndrop_underscore_headers = true\n[upstreams.up_drop]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"up_drop\"\nprefix = \"/d\"\nupstream = \"up_drop\"\n",
        up.addr
    ))
    .await;
    let vars = cgi_vars(&gw, "/d/x", &[("X_Custom", "1"), ("x-other", "2")]).await;
    assert_eq!(var(&vars, "HTTP_X_CUSTOM"), None, "{vars:?}");
    assert_eq!(var(&vars, "HTTP_X_OTHER"), Some("2"), "{vars:?}");
}

/// A client's request trailers cannot carry what the route's rules set or
/// remove, nor what the gateway sets, in any spelling: an upstream that
/// merges trailers into headers would take them from the client.
#[tokio::test]
async fn request_trailers_cannot_carry_ruled_or_gateway_headers() {
    let up = TestUpstream::start(|req: Request<Incoming>| async move {
        let collected = http_body_util::BodyExt::collect(req.into_body()).await.unwrap();
        let mut names: Vec<String> =
            collected.trailers().map(|t| t.keys().map(|k| k.as_str().to_owned()).collect()).unwrap_or_default();
        names.sort();
        Response::new(full(names.join(",")))
    })
    .await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.ut]\nurl = \"http://{}\"\n[[routes]]\nname = \"ut\"\nprefix = \"/t\"\nupstream = \"ut\"\n\
         request_headers = {{ set = {{ \"x-user\" = \"gateway-set\" }}, remove = [\"x-debug\"] }}\n",
        up.addr
    ))
    .await;
    let chunked = "POST /t/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: x-user, x-debug, x-forwarded-for, x-checksum\r\nConnection: close\r\n\r\n\
                   4\r\nbody\r\n0\r\nx-user: evil\r\nX_Debug: 1\r\nX-Forwarded-For: 7.7.7.7\r\nx-checksum: ok\r\n\r\n";
    let r = raw(gw.addr, chunked.as_bytes(), std::time::Duration::from_secs(3)).await;
    assert_eq!(r.status(), 200, "{}", r.text);
    assert!(r.text.ends_with("\r\n\r\nx-checksum"), "only the client's own trailer passes: {:?}", r.text);
}
