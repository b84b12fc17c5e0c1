//! A newcomer's mistakes, each answered with the key that is wrong, what
//! is wrong with it and what is accepted, and never with a secret.

use super::inline;

/// `(file, key the error names, words it says)`, every one refused.
fn refused(cases: &[(String, &str, &str)]) {
    for (text, key, says) in cases {
        let e = inline(text).map(|_| ()).expect_err(text);
        assert_eq!(e.key, *key, "{text}: {e}");
        assert!(e.message.contains(says), "{text}: wanted {says:?} in: {e}");
    }
}

const TWO_UPSTREAMS: &str = "[upstreams.a]\nurl = 'http://127.0.0.1:9'\n[upstreams.b]\nurl = 'http://127.0.0.1:8'\n";

fn route(rest: &str) -> String {
    format!("{TWO_UPSTREAMS}[[routes]]\nname = 'x'\nprefix = '/x'\n{rest}\n")
}

fn split(sticky: &str) -> String {
    route(&format!("split = [{{ upstream = 'a', weight = 1 }}, {{ upstream = 'b', weight = 1 }}]\nsticky = {sticky}"))
}

/// A value that is a text or a table (or a number or a text) names the
/// key inside its table that is wrong, rather than only listing its forms.
#[test]
fn a_typo_inside_a_text_or_table_value_is_named() {
    refused(&[
        (split("{ cookei = 'sid' }"), "routes[0].sticky.cookei", "unknown key; did you mean `cookie`?"),
        (split("{ cookie = 'sid', max_aeg = '1d' }"), "routes[0].sticky.max_aeg", "did you mean `max_age`?"),
        (split("{ cookie = 'sid', set = [1] }"), "routes[0].sticky.set", "expected a boolean"),
        (
            "[upstreams.a]\nendpoints = [{ url = 'http://127.0.0.1:1', wieght = 2 }]\n".into(),
            "upstreams.a.endpoints[0].wieght",
            "did you mean `weight`?",
        ),
        ("[upstreams.a]\nendpoints = [{ weight = 2 }]\n".into(), "upstreams.a.endpoints[0].url", "missing"),
        (route("upstream = 'a'\nheaders = { x = { regx = '^1$' } }"), "routes[0].headers.x.regx", "`regex`?"),
        (route("upstream = 'a'\nquery = { v = 2 }"), "routes[0].query.v", "write the value as a text, in quotes"),
        ("[server]\nmax_body = 1.5\n".into(), "server.max_body", "a fraction needs a unit, e.g. \"1.5MiB\""),
        ("[server]\nmax_body = { size = 1 }\n".into(), "server.max_body", "a size such as \"64KiB\""),
        (
            "[upstreams.a]\nurl = 'http://h:1'\nmax_requests = { limit = 5 }\n".into(),
            "upstreams.a.max_requests",
            "a number or \"auto\"",
        ),
    ]);
}

/// Every form of those values still loads.
#[test]
fn each_form_of_a_text_or_table_value_loads() {
    for text in [
        split("'cookie:sid'"),
        split("{ cookie = 'sid', set = true, max_age = '1d' }"),
        split("{ header = 'x-user' }"),
        "[upstreams.a]\nendpoints = ['http://127.0.0.1:1', { url = 'http://127.0.0.1:2', weight = 3 }]\n".into(),
        route("upstream = 'a'\nheaders = { a = true, b = false, c = '*', d = 'v', e = { regex = '^1$' } }"),
        "[server]\nmax_body = 2048\nmax_header_size = '64KiB'\nmax_uri_length = '9000'\n".into(),
        "[upstreams.a]\nurl = 'http://h:1'\nmax_requests = 8\n".into(),
        "[upstreams.a]\nurl = 'http://h:1'\nmax_requests = 'auto'\n".into(),
    ] {
        inline(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

/// A table form written as a list of its values in field order loaded
/// before these values were read by hand (serde's untagged enums took it),
/// and still does, to the same values.
#[test]
fn a_table_form_written_as_a_list_still_loads() {
    let c = inline("[upstreams.a]\nendpoints = [['http://127.0.0.1:2', 3]]\n").unwrap();
    assert_eq!(c.upstreams[0].endpoints.iter().map(|e| e.weight).collect::<Vec<_>>(), [3]);
    inline(&route("upstream = 'a'\nheaders = { x-a = ['^a+$'] }\nquery = { v = ['2|3'] }")).unwrap();
}

/// A value of the wrong type is told in TOML's words (table, list, whole
/// number), never with serde's (map, sequence, 64-bit integer).
#[test]
fn wrong_types_are_told_in_the_files_words() {
    refused(&[
        (
            "[routes]\nname = 'x'\n".into(),
            "routes",
            "invalid type: table, expected a list; each route is its own [[routes]]",
        ),
        ("upstreams = 'app'\n".into(), "upstreams", "invalid type: string \"app\", expected a table"),
        (
            "[server]\nworker_threads = -1\n".into(),
            "server.worker_threads",
            "integer -1, expected a whole number, 0 or more",
        ),
        (
            route("upstream = 'a'\nretries = 5000000000"),
            "routes[0].retries",
            "expected a whole number from 0 to 4294967295",
        ),
        (route("upstream = { name = 'a' }"), "routes[0].upstream", "invalid type: table, expected a string"),
        (
            route("upstream = 'a'\nrequest_headers = { set = ['x-a: 1'] }"),
            "routes[0].request_headers.set",
            "list, expected a table",
        ),
        ("[server]\ntrusted_proxies = '10.0.0.0/8'\n".into(), "server.trusted_proxies", "expected a list"),
    ]);
}

/// A text where a table belongs may be the secret the table was meant to
/// hold (a Redis URL with its password, a token, a user and password): it
/// is not shown, and the error still says where and what.
#[test]
fn a_secret_given_where_a_table_belongs_is_not_shown() {
    let cases = [
        ("rate_limit_store = 'redis://:SECRET1@127.0.0.1:6379'\n".to_owned(), "rate_limit_store", "SECRET1"),
        (route("respond = { status = 200 }\nauth = 'Bearer SECRET2'"), "routes[0].auth", "SECRET2"),
        (route("respond = { status = 200 }\nauth = { basic = 'admin:SECRET3' }"), "routes[0].auth.basic", "SECRET3"),
        (route("respond = { status = 200 }\nauth = { jwt = 'SECRET4' }"), "routes[0].auth.jwt", "SECRET4"),
    ];
    for (text, key, secret) in cases {
        let e = inline(&text).map(|_| ()).expect_err(&text);
        let shown = e.to_string();
        assert_eq!(e.key, key, "{shown}");
        assert!(!shown.contains(secret) && shown.contains("expected a table"), "{shown}");
    }
    // A value refused for its form is shown as /-/config would show it.
    let jwt =
        "auth = { jwt = { jwks_url = 'https://id.example/jwks', algorithms = ['RS256'], from = 'Bearer SECRET5' } }";
    let cases = [
        ("[upstreams.d]\ndiscover = { dns = 'u:SECRET6@name:53' }\n".to_owned(), "upstreams.d.discover.dns", "SECRET6"),
        ("[upstreams.d]\ndiscover = { dns = 'u:SECRET7@name:x' }\n".to_owned(), "upstreams.d.discover.dns", "SECRET7"),
        (
            "[upstreams.d]\ndiscover = { srv = 'u:SECRET8@_h._tcp.n' }\n".to_owned(),
            "upstreams.d.discover.srv",
            "SECRET8",
        ),
        (route(&format!("respond = {{ status = 200 }}\n{jwt}")), "routes[0].auth.jwt.from", "SECRET5"),
    ];
    for (text, key, secret) in cases {
        let e = inline(&text).map(|_| ()).expect_err(&text);
        let shown = e.to_string();
        assert_eq!(e.key, key, "{shown}");
        assert!(!shown.contains(secret) && shown.contains("<redacted>"), "{shown}");
    }
}

/// Addresses and sizes say what to write, not what their parser met.
#[test]
fn addresses_and_sizes_say_what_to_write() {
    refused(&[
        ("[server]\nlisten = 'localhost:8080'\n".into(), "server.listen", "write \"127.0.0.1:8080\""),
        ("[server]\nlisten = '127.0.0.1'\n".into(), "server.listen", "the port is missing"),
        ("[metrics]\nlisten = '9090'\n".into(), "metrics.listen", "a port alone is not an address"),
        ("[server]\nmax_body = '-1MiB'\n".into(), "server.max_body", "a size cannot be negative"),
        ("[server]\nmax_body = '10 MB!'\n".into(), "server.max_body", "a size is a number and a unit"),
    ]);
    let e = inline("[server]\nmax_body = '-1MiB'\n").map(|_| ()).unwrap_err().to_string();
    assert!(!e.contains("float") && !e.contains("ByteSize"), "{e}");
}

/// Durations say what to write for a decimal without a unit, a sign, and
/// a unit in capitals.
#[test]
fn durations_say_what_to_write() {
    refused(&[
        ("[server]\nidle_timeout = '0.5'\n".into(), "server.idle_timeout", "needs its unit: \"0.5s\" or \"0.5ms\""),
        ("[server]\nidle_timeout = '-5s'\n".into(), "server.idle_timeout", "a duration cannot be negative"),
        ("[server]\nidle_timeout = '5S'\n".into(), "server.idle_timeout", "units are written in lower case: \"5s\""),
        ("[server]\nidle_timeout = '5 Sec'\n".into(), "server.idle_timeout", "lower case: \"5 sec\""),
        (route("upstream = 'a'\nmethods = 'GET'"), "routes[0].methods", "a list is written in brackets"),
    ]);
    for ok in ["1.5s", "5 seconds", "1m30s", "500 ms"] {
        inline(&format!("[server]\nidle_timeout = '{ok}'\n")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

/// An unknown upstream lists the defined ones in name order (the same on
/// every run) and the nearest, wherever a route names one.
#[test]
fn an_unknown_upstream_lists_the_known_ones_in_order() {
    let many = "[upstreams.zeta]\nurl='http://h:1'\n[upstreams.service_a]\nurl='http://h:2'\n[upstreams.mid]\nurl='http://h:3'\n";
    let route = |rest: &str| format!("{many}[[routes]]\nname='x'\nprefix='/x'\n{rest}\n");
    let known = "(known: mid, service_a, zeta)";
    for _ in 0..4 {
        refused(&[
            (route("upstream = 'ghost'"), "routes[0].upstream", known),
            (route("upstream = 'service-a'"), "routes[0].upstream", "; did you mean \"service_a\"?"),
            (
                route("split = [{ upstream = 'zeta', weight = 1 }, { upstream = 'zeat', weight = 1 }]"),
                "routes[0].split[1].upstream",
                "unknown upstream \"zeat\" (known: mid, service_a, zeta); did you mean \"zeta\"?",
            ),
            (route("upstream = 'zeta'\nmirror = { upstream = 'shadow' }"), "routes[0].mirror.upstream", known),
        ]);
    }
}
