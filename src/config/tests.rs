//! Table tests of loading and validation: every bad key exits with its
//! name and reason.

use super::*;

mod newcomer;

/// Relative paths in the tables resolve against the source tree's
/// `config/` folder (`public/demo.txt` and the like).
fn inline(text: &str) -> Result<Config, ConfigError> {
    let base_dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
    load(&Source::Inline { text: text.to_owned(), base_dir })
}

const UP: &str = "[upstreams.a]\nurl = \"http://127.0.0.1:9\"\n";

#[test]
fn embedded_default_is_valid() {
    let files = crate::demo::files().unwrap();
    let c = load(&Source::embedded(files.path().to_owned())).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert!(c.routes.iter().any(|r| r.name == "b" && matches!(r.target, Target::Proxy(_))));
    assert!(c.routes.iter().any(|r| matches!(r.target, Target::File(_))));
}

#[test]
fn bad_configs_name_key_and_problem() {
    let cases: &[(&str, &str, &str)] = &[
        ("[[routes]]\nname='x'\nprefix='/x'\nupstream='nope'\n", "routes[0].upstream", "unknown upstream \"nope\""),
        ("[[routes]]\nname='x'\nprefix='/p/a%2fb'\nupstream='a'\n", "routes[0].prefix", "cannot hold ';' or '%2F'"),
        ("[[routes]]\nname='x'\nprefix='/app;v=2'\nupstream='a'\n", "routes[0].prefix", "cannot hold ';' or '%2F'"),
        ("[[routes]]\nname='x'\nprefix='/x'\n", "routes[0].upstream", "has no target"),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nrespond={status=200}\n",
            "routes[0].respond",
            "sets upstream and respond",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nfile='f'\nrespond={status=200}\n",
            "routes[0].respond",
            "sets file and respond",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\ntimeout='2 parsecs'\n",
            "routes[0].timeout",
            "invalid duration",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\n[[routes]]\nname='x'\nprefix='/y'\nupstream='a'\n",
            "routes[1].name",
            "duplicate route name",
        ),
        ("[upstreams.b]\nurl='not a url'\n", "upstreams.b.url", "invalid URL"),
        ("[upstreams.b]\nurl='ftp://x:1'\n", "upstreams.b.url", "unsupported scheme"),
        ("[[routes]]\nname='x'\nprefix='/x'\ndir='no/such/dir'\n", "routes[0].dir", "is not a directory"),
        ("[[routes]]\nname='x'\nprefix='/x'\nfile='no/such.txt'\n", "routes[0].file", "is not a readable file"),
        ("[[routes]]\nname='x'\nprefix='x'\nupstream='a'\n", "routes[0].prefix", "must start with '/'"),
        ("[server]\nlisten='nowhere'\n", "server.listen", "invalid socket address"),
        ("[server]\nshutdown_timeout='soon'\n", "server.shutdown_timeout", "invalid duration"),
        (
            "[server]\nshutdown_timeout = 5\n",
            "server.shutdown_timeout",
            "a duration needs its unit: \"5s\" or \"5ms\", not 5",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nrespond={status=200}\ntimeout='1s'\n",
            "routes[0].timeout",
            "only applies",
        ),
        ("[server]\nmax_body='lots'\n", "server.max_body", "invalid size"),
        ("[server]\nmax_header_size=100\n", "server.max_header_size", "at least 8KiB"),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_body='1 parsec'\n",
            "routes[0].max_body",
            "invalid size",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_concurrent=0\n",
            "routes[0].max_concurrent",
            "at least 1",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nupgrade_idle_timeout='0s'\n",
            "routes[0].upgrade_idle_timeout",
            "greater than zero",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nupgrade_idle_timeout='500000000000years'\n",
            "routes[0].upgrade_idle_timeout",
            "at most 10 years",
        ),
        ("[server]\nshutdown_timeout='11years'\n", "server.shutdown_timeout", "at most 10 years"),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nupgrade=false\nupgrade_idle_timeout='9s'\n",
            "routes[0].upgrade_idle_timeout",
            "no effect with upgrade = false",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nrespond={status=200}\nupgrade=true\n",
            "routes[0].upgrade",
            "only applies to routes with an upstream",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\ndotfiles=true\n",
            "routes[0].dotfiles",
            "only applies to routes with a dir",
        ),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nbody_timeout='0s'\n",
            "routes[0].body_timeout",
            "greater than zero",
        ),
        ("[server]\nidle_timeout='0s'\n", "server.idle_timeout", "greater than zero"),
        ("[server]\nsend_timeout='never'\n", "server.send_timeout", "invalid duration"),
        ("[server]\ntcp_keepalive='10ms'\n", "server.tcp_keepalive", "at least 1s"),
        ("[server]\nshutdown_delay='later'\n", "server.shutdown_delay", "invalid duration"),
        ("[server]\ntrusted_proxies=['10.0.0.0/8', '10.0.0.0/33']\n", "server.trusted_proxies[1]", "invalid CIDR"),
        ("[metrics]\nmax_connections=0\n", "metrics.max_connections", "at least 1"),
        (
            "[upstreams.x]\nurl='http://h:1'\nmax_requests=3000000000000000000\n",
            "upstreams.x.max_requests",
            "between 1 and",
        ),
        ("[upstreams.x]\nurl='http://h:1'\nmax_requests='fast'\n", "upstreams.x.max_requests", "or \"auto\""),
        ("[upstreams.x]\nurl='http://h:1'\nmax_requests=0\n", "upstreams.x.max_requests", "between 1 and"),
        ("[upstreams.x]\nurl='http://h:1'\nmax_requests='auto'\nauto_min=0\n", "upstreams.x.auto_min", "between 1 and"),
        (
            "[upstreams.x]\nurl='http://h:1'\nmax_requests='auto'\nauto_min=10\nauto_max=5\n",
            "upstreams.x.auto_max",
            "between auto_min (10)",
        ),
        (
            "[upstreams.x]\nurl='http://h:1'\nmax_requests=8\nauto_max=50\n",
            "upstreams.x.auto_max",
            "only applies with max_requests = \"auto\"",
        ),
        ("[upstreams.x]\nurl='http://h:1'\nauto_min=2\n", "upstreams.x.auto_min", "only applies with max_requests"),
        (
            "[upstreams.x]\nurl='http://h:1'\nretry_budget={ratio=1.0, min_per_second=4294967295}\n",
            "upstreams.x.retry_budget.min_per_second",
            "at most",
        ),
        ("[tracing]\notlp_endpoint='http://u:p@h:4318'\n", "tracing.otlp_endpoint", "credentials"),
        ("[tracing]\notlp_endpoint='http://h:4318/?token=t'\n", "tracing.otlp_endpoint", "query or fragment"),
        ("[tracing]\notlp_endpoint='http://h:4318?token=t'\n", "tracing.otlp_endpoint", "query or fragment"),
        ("[tracing]\notlp_endpoint='http://h:4318/otlp#t'\n", "tracing.otlp_endpoint", "query or fragment"),
        ("[[routes]]\nname='x'\nprefix='/a//b'\nupstream='a'\n", "routes[0].prefix", "not a normalised path"),
        ("[[routes]]\nname='x'\nprefix='/x'\nrespond={status=999}\n", "routes[0].respond.status", "200 to 599"),
        ("[[routes]]\nname='x'\nprefix='/x'\nrespond={status=600}\n", "routes[0].respond.status", "200 to 599"),
        ("[[routes]]\nname='x'\nprefix='/x'\nrespond={status=101}\n", "routes[0].respond.status", "200 to 599"),
        ("[[routes]]\nname='x'\nprefix='/a/../b'\nupstream='a'\n", "routes[0].prefix", "not a normalised path"),
        ("[rate_limit_store]\nurl='redis://:p@h:6379/0#x'\n", "rate_limit_store.url", "a fragment"),
        (
            "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmethods=['get', 'G\u{e9}T']\n",
            "routes[0].methods[1]",
            "is not an HTTP method",
        ),
        ("[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmethods=[]\n", "routes[0].methods", "is empty"),
    ];
    for (text, key, msg) in cases {
        let e = inline(&format!("{UP}{text}")).expect_err(text);
        assert_eq!(e.key, *key, "{text}: {e}");
        assert!(e.message.contains(msg), "{text}: {e}");
        assert_eq!(e.source_name, "embedded default");
    }
}

/// A value refused at load is not echoed where it may be a secret (a
/// token pasted with its line's end, a value pasted after a header's name,
/// a token in a path's query): `gateway check`'s output and a reload's
/// answer land in CI logs. The error still says where and what.
#[test]
fn a_refused_secret_is_not_echoed() {
    let route = "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\n";
    let cases: [(&str, &str, &str); 8] = [
        ("request_headers={set={'X-Api-Key'=\"SECRET1\\n\"}}", "request_headers.set.X-Api-Key", "at byte 8"),
        ("request_headers={set={'Authorization'=\"Bearer SECRET2\\u0001\"}}", "Authorization", "<redacted>"),
        ("response_headers={set={'Set-Cookie'=\"sid=SECRET3\\r\\nX: y\"}}", "Set-Cookie", "at byte 12"),
        ("request_headers={set={'X-Api-Key SECRET4'='v'}}", "X-Api-Key…", "\"X-Api-Key…\""),
        ("request_headers={remove=['X-Api-Key SECRET5']}", "remove[0]", "X-Api-Key…"),
        ("rewrite='/x?apikey=SECRET6'", "routes[0].rewrite", "apikey=<redacted>"),
        (
            "auth={forward={url='http://127.0.0.1:9/', request_headers=['Cookie SECRET7']}}",
            "request_headers[0]",
            "Cookie…",
        ),
        ("rate_limit={rate='1/s', key='header:X-Key SECRET8'}", "rate_limit.key", "X-Key…"),
    ];
    for (i, (extra, key, says)) in cases.iter().enumerate() {
        let text = format!("{UP}{route}{extra}\n");
        let e = inline(&text).expect_err(extra);
        let shown = e.to_string();
        assert!(!shown.contains(&format!("SECRET{}", i + 1)), "{extra}: {shown}");
        assert!(e.key.contains(key) && shown.contains(says), "{extra}: {shown}");
    }
    // Whole configurations: (text, its secret, what the error says).
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.SECRET12";
    let whole = [
        (format!("{route}rewrite='x?token=SECRET11'\n"), "SECRET11", "x?token=<redacted>".to_owned()),
        (
            format!("{route}request_headers={{set={{'X-JWT-Assertion'=\"{jwt}\\n\"}}}}\n"),
            "SECRET12",
            "<redacted>".into(),
        ),
        (format!("{route}headers={{\"X-Api-Key SECRET13\"=\"*\"}}\n"), "SECRET13", "headers.X-Api-Key…".into()),
        (format!("{route}headers={{\"x-forward\"={{regex=\"Bearer SECRET14(\"}}}}\n"), "SECRET14", "pattern".into()),
        ("[upstreams.b]\nurl='http:/user:SECRET15@h:80'\n".to_owned(), "SECRET15", "user:<redacted>@h".into()),
        ("[metrics]\npath='m?token=SECRET16'\n".to_owned(), "SECRET16", "m?token=<redacted>".into()),
        (
            "[[routes]]\nname='x'\nprefix='/x?token=SECRET17'\nupstream='a'\n".to_owned(),
            "SECRET17",
            "token=<redacted>".into(),
        ),
    ];
    for (text, secret, says) in &whole {
        let e = inline(&format!("{UP}{text}")).expect_err(text);
        assert!(!e.to_string().contains(secret) && e.to_string().contains(says.as_str()), "{text}: {e}");
    }
    let health = "[upstreams.h]\nurl='http://127.0.0.1:9'\nhealth={path='/h?token=SECRET9 x'}\n";
    let e = inline(&format!("{UP}{health}")).expect_err("health");
    assert!(!e.to_string().contains("SECRET9") && e.to_string().contains("token=<redacted>"), "{e}");
    let redirect =
        "[[routes]]\nname='r'\nprefix='/r'\nredirect={location=\"https://x.example/?token=SECRET10\\u0001\"}\n";
    let e = inline(&format!("{UP}{redirect}")).expect_err("redirect");
    assert!(!e.to_string().contains("SECRET10") && e.to_string().contains("byte 34"), "{e}");
}

#[test]
fn unknown_key_is_refused() {
    let e = inline("[server]\nlisten_on='x'\n").unwrap_err();
    assert!(e.to_string().contains("listen_on"), "{e}");
}

#[test]
fn defaults_apply() {
    let c = inline(&format!("{UP}[[routes]]\nname='x'\nprefix='/x/'\nupstream='a'\n")).unwrap();
    assert_eq!(c.routes[0].prefix, "/x");
    let Target::Proxy(p) = &c.routes[0].target else { panic!() };
    assert_eq!(p.timeout, DEFAULT_ROUTE_TIMEOUT);
    assert_eq!(p.host, HostMode::Preserve);
    assert_eq!(c.upstreams[0].pool_idle_timeout, Duration::from_secs(50));
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.metrics.path, "/metrics");
    assert_eq!(c.server.max_body, 10 * 1024 * 1024);
    assert_eq!(c.server.max_header_size, 64 * 1024);
    assert_eq!(c.server.max_uri_length, 8 * 1024);
    assert_eq!(c.routes[0].max_body, c.server.max_body);
    assert_eq!(c.routes[0].max_concurrent, None);
    assert_eq!(p.body_timeout, DEFAULT_BODY_TIMEOUT);
    assert_eq!(c.server.idle_timeout, Duration::from_secs(60));
    assert_eq!(c.server.send_timeout, Duration::from_secs(60));
    assert_eq!(c.server.park_after, Some(Duration::from_millis(100)));
    assert_eq!(c.server.tcp_keepalive, Some(Duration::from_secs(60)));
    assert_eq!(c.server.shutdown_delay, Duration::ZERO);
    assert!(c.server.merge_slashes && !c.server.reject_encoded_slash);
    assert!(c.server.trusted_proxies.is_empty());
    assert_eq!(c.metrics.max_connections, 64);
    assert_eq!(c.server.http1, Http1Server::Gateway);
}

#[test]
fn trusted_proxies_parse_as_blocks_or_addresses() {
    let c = inline("[server]\ntrusted_proxies = ['10.1.2.3/8', '::1', '192.168.0.7']\ntcp_keepalive = '0s'\n").unwrap();
    let nets: Vec<String> = c.server.trusted_proxies.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["10.0.0.0/8", "::1/128", "192.168.0.7/32"]);
    assert_eq!(c.server.tcp_keepalive, None);
}

#[test]
fn sizes_parse_as_text_or_bytes() {
    let c = inline(&format!(
        "[server]\nmax_body = 2048\nmax_uri_length = \"1KiB\"\n{UP}[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_body='64KiB'\nmax_concurrent=3\n[[routes]]\nname='y'\nprefix='/y'\nupstream='a'\n"
    ))
    .unwrap();
    assert_eq!(c.server.max_body, 2048);
    assert_eq!(c.server.max_uri_length, 1024);
    assert_eq!(c.routes[0].max_body, 64 * 1024);
    assert_eq!(c.routes[0].max_concurrent, Some(3));
    assert_eq!(c.routes[1].max_body, 2048);
}

#[test]
fn max_requests_is_a_number_or_auto_with_bounds() {
    use super::AutoBounds as Bounds;
    // (keys, limit)
    let cases = [
        ("max_requests = 8", MaxRequests::Fixed(8)),
        ("max_requests = \"8\"", MaxRequests::Fixed(8)),
        ("max_requests = \"auto\"", MaxRequests::Auto(Bounds { min: 3, max: 1000 })),
        ("max_requests = \"auto\"\nauto_min = 1\nauto_max = 64", MaxRequests::Auto(Bounds { min: 1, max: 64 })),
        ("max_requests = \"auto\"\nauto_min = 8\nauto_max = 8", MaxRequests::Auto(Bounds { min: 8, max: 8 })),
    ];
    for (keys, want) in cases {
        let c = inline(&format!("[upstreams.a]\nurl = \"http://127.0.0.1:9\"\n{keys}\n")).unwrap();
        let a = c.upstreams[0].admission.expect("admission");
        assert_eq!((a.max_requests, a.queue, a.queue_timeout), (want, 100, Duration::from_secs(5)), "{keys}");
    }
}

/// A value of the wrong shape is answered with what the key accepts, in
/// the file's words, never with the name of the Rust type it is read into.
#[test]
fn wrong_shapes_name_what_is_accepted() {
    let route = |rest: &str| format!("[[routes]]\nname='x'\nprefix='/x'\n{rest}\n");
    let upstream = |rest: &str| format!("[upstreams.a]\nurl='http://127.0.0.1:9'\n{rest}\n");
    let cases: &[(String, &str, &str)] = &[
        ("server = 5\n".into(), "server", "a table ([server])"),
        ("[server]\nmax_body = -5\n".into(), "server.max_body", "a size such as \"64KiB\" or a number of bytes"),
        ("[server]\ntls = 5\n".into(), "server.tls", "a table ([server.tls])"),
        ("metrics = 5\n".into(), "metrics", "a table ([metrics])"),
        ("tracing = 5\n".into(), "tracing", "a table ([tracing])"),
        ("resolver = 5\n".into(), "resolver", "a table ([resolver])"),
        ("rate_limit_store = 5\n".into(), "rate_limit_store", "a table ([rate_limit_store])"),
        ("upstreams = { a = 5 }\n".into(), "upstreams.a", "a table ([upstreams.NAME])"),
        (upstream("discover = 5"), "upstreams.a.discover", "a table (discover = {"),
        (upstream("max_requests = true"), "upstreams.a.max_requests", "a number or \"auto\""),
        (upstream("endpoints = [5]"), "upstreams.a.endpoints", "a URL or a table ({ url ="),
        (upstream("health = 5"), "upstreams.a.health", "a table (health = {"),
        (upstream("outlier = 5"), "upstreams.a.outlier", "a table (outlier = {"),
        (upstream("retry_budget = 5"), "upstreams.a.retry_budget", "a table (retry_budget = {"),
        ("routes = [5]\n".into(), "routes", "a table ([[routes]])"),
        (route("max_body = -5"), "routes[0].max_body", "a size such as \"64KiB\" or a number of bytes"),
        (route("cache = true"), "routes[0].cache", "a table (cache = { max_size = \"64MiB\" })"),
        (route("respond = 'hello'"), "routes[0].respond", "a table (respond = {"),
        (route("redirect = 5"), "routes[0].redirect", "a table (redirect = {"),
        (route("mirror = 5"), "routes[0].mirror", "a table (mirror = {"),
        (route("sticky = 5"), "routes[0].sticky", "\"header:NAME\", \"cookie:NAME\" or a table"),
        (route("split = [5]"), "routes[0].split", "a table ({ upstream ="),
        (route("headers = { x = 5 }"), "routes[0].headers", "a text, true, false or a table ({ regex ="),
        (route("request_headers = 5"), "routes[0].request_headers", "a table ({ set ="),
        (route("rate_limit = 5"), "routes[0].rate_limit", "a table (rate_limit = {"),
        (route("auth = 5"), "routes[0].auth", "a table (auth = {"),
        (route("auth = { basic = 5 }"), "routes[0].auth.basic", "a table (basic = {"),
        (route("auth = { jwt = 5 }"), "routes[0].auth.jwt", "a table (jwt = {"),
        (route("auth = { forward = 5 }"), "routes[0].auth.forward", "a table (forward = {"),
    ];
    for (text, key, want) in cases {
        let e = inline(text).map(|_| ()).unwrap_err();
        let shown = e.to_string();
        assert!(e.key.starts_with(key), "{text}: key {:?}, wanted {key:?}: {shown}", e.key);
        assert!(e.message.contains(want), "{text}: wanted {want:?} in: {shown}");
        assert!(!shown.contains("Raw"), "{text}: a Rust type is named: {shown}");
    }
}

/// Every type the file is read into says what it accepts, so a type added
/// later cannot bring its Rust name back into the messages.
#[test]
fn every_raw_type_says_what_it_accepts() {
    let sources = [include_str!("raw.rs"), include_str!("raw_access.rs"), include_str!("ratelimit.rs")];
    // A type read by hand says it in its visitor's `expecting`.
    let by_hand = include_str!("raw/either.rs");
    for text in sources {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate().skip(1) {
            let Some(name) = ["pub(super) struct ", "pub(super) enum "].iter().find_map(|p| line.strip_prefix(p))
            else {
                continue;
            };
            let name = name.trim_end_matches(" {");
            if !name.starts_with("Raw") {
                continue;
            }
            let read_by_hand = by_hand.contains(&format!("Visitor<'de> for Expecting<{name}>"))
                && by_hand.contains(&format!("Deserialize<'de> for {name}"));
            assert!(lines[i - 1].contains("#[serde(expecting = ") || read_by_hand, "no `expecting` on: {line}");
        }
    }
}

/// An upstream name with a dot, written bare, is told how to quote it.
#[test]
fn a_bare_dotted_upstream_name_is_told_to_quote_it() {
    let e = inline("[upstreams.svc.v1]\nurl = 'http://127.0.0.1:9'\n").map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("[upstreams.\"svc.v1\"]"), "{e}");
    // Any other unknown key of an upstream is not, nor a typo of one of
    // its tables.
    let e = inline("[upstreams.svc]\nurl = 'http://127.0.0.1:9'\nzzzz = 1\n").map(|_| ()).unwrap_err();
    assert!(!e.to_string().contains("quotes"), "{e}");
    let e = inline("[upstreams.svc]\nurl = 'http://127.0.0.1:9'\n[upstreams.svc.helth]\npath = '/'\n");
    let e = e.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("did you mean `health`") && !e.contains("quotes"), "{e}");
}

/// `/-/config` shows a defaulted retry ratio as written (0.2), not as the
/// `f32` widened to `f64` (0.20000000298023224); an unknown upstream with
/// none defined says so rather than `(known: )`.
#[test]
fn effective_ratio_and_an_empty_upstream_list_read_as_written() {
    let c = inline("[upstreams.a]\nurl='http://h:1'\n[[routes]]\nname='r'\nprefix='/'\nupstream='a'\n").unwrap();
    assert_eq!(c.effective["upstreams"]["a"]["retry_budget"]["ratio"], serde_json::json!(0.2));
    let e = inline("[[routes]]\nname='r'\nprefix='/'\nupstream='a'\n").unwrap_err().to_string();
    assert!(e.contains("unknown upstream \"a\" (no [upstreams] are defined)"), "{e}");
}
