//! Table tests of the rules, and a property test of freshness and
//! storability against RFC 9111's rules written out plainly.

use super::*;
use http::HeaderValue;
use proptest::prelude::*;

fn head(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

fn is_storable(req: &[(&str, &str)], status: u16, res: &[(&str, &str)], default_ttl: u64) -> bool {
    let mut rq = http::Request::new(());
    *rq.uri_mut() = "/x".parse().unwrap();
    *rq.headers_mut() = head(req);
    let (rq, ()) = rq.into_parts();
    let mut rs = http::Response::new(());
    *rs.status_mut() = StatusCode::from_u16(status).unwrap();
    *rs.headers_mut() = head(res);
    let (rs, ()) = rs.into_parts();
    let d = Directives::of(&rs.headers);
    let life = lifetime(&rs.headers, &d, Duration::from_secs(default_ttl));
    storable_by_head(rs.status, &rs.headers, life) && storable_for(&rq.headers, &d)
}

type Headers<'a> = &'a [(&'a str, &'a str)];

/// The fields a request has, found in one pass: each flag from its own
/// fields only, whatever their case or order.
#[test]
fn present_fields() {
    let none = Present::default();
    let cases: &[(&[(&str, &str)], Present)] = &[
        (&[], none),
        (&[("host", "a"), ("user-agent", "x"), ("accept", "*/*")], none),
        (&[("Cache-Control", "no-cache")], Present { directives: true, ..none }),
        (&[("pragma", "no-cache")], Present { directives: true, ..none }),
        (&[("if-none-match", "\"x\"")], Present { conditional: true, ..none }),
        (&[("If-Modified-Since", "Mon, 01 Jan 2024 00:00:00 GMT")], Present { conditional: true, ..none }),
        (&[("upgrade", "websocket")], Present { upgrade: true, ..none }),
        (&[("range", "bytes=0-1")], Present { range: true, ..none }),
        (
            &[("range", "bytes=0-1"), ("host", "a"), ("cache-control", "max-age=0"), ("if-none-match", "*")],
            Present { directives: true, conditional: true, range: true, ..none },
        ),
    ];
    for (fields, want) in cases {
        assert_eq!(Present::of(&head(fields)), *want, "{fields:?}");
    }
}

#[test]
fn storing_rules() {
    let cases: &[(Headers, u16, Headers, u64, bool)] = &[
        (&[], 200, &[("cache-control", "max-age=60")], 0, true),
        (&[], 200, &[], 0, false),
        (&[], 200, &[], 10, true),
        (&[], 404, &[], 10, true),
        (&[], 302, &[], 10, false),
        (&[], 302, &[("cache-control", "max-age=5")], 0, true),
        (&[], 206, &[("cache-control", "max-age=5")], 0, false),
        (&[], 200, &[("cache-control", "max-age=5, no-store")], 0, false),
        (&[], 200, &[("cache-control", "max-age=5, private")], 0, false),
        (&[("cache-control", "no-store")], 200, &[("cache-control", "max-age=5")], 0, false),
        (&[], 200, &[("cache-control", "max-age=5"), ("set-cookie", "a=b")], 0, false),
        (&[("authorization", "x")], 200, &[("cache-control", "max-age=5")], 0, false),
        (&[("authorization", "x")], 200, &[("cache-control", "max-age=5, public")], 0, true),
        (&[("authorization", "x")], 200, &[("cache-control", "s-maxage=5")], 0, true),
        (&[("authorization", "x")], 200, &[("cache-control", "max-age=5, must-revalidate")], 0, true),
        (&[], 200, &[("cache-control", "max-age=5"), ("vary", "*")], 0, false),
        (&[], 500, &[], 10, false),
        (&[], 500, &[("cache-control", "max-age=5")], 0, true),
        (&[], 599, &[("cache-control", "max-age=5")], 0, true),
        (&[], 400, &[("expires", "Fri, 01 Jan 2100 00:00:00 GMT")], 0, true),
        (&[], 304, &[("cache-control", "max-age=5")], 0, false),
        (&[], 200, &[("cache-control", "max-age=5, no-store, must-understand")], 0, true),
        (&[], 503, &[("cache-control", "max-age=5, no-store, must-understand")], 0, true),
        (&[], 599, &[("cache-control", "max-age=5, no-store, must-understand")], 0, false),
        (&[], 599, &[("cache-control", "max-age=5, must-understand")], 0, false),
        (&[], 200, &[("cache-control", "max-age=5, private, must-understand")], 0, false),
        (&[("cache-control", "no-store")], 200, &[("cache-control", "max-age=5, must-understand")], 0, false),
    ];
    for (i, (req, status, res, ttl, want)) in cases.iter().enumerate() {
        assert_eq!(is_storable(req, *status, res, *ttl), *want, "case {i}");
    }
}

#[test]
fn lifetime_order() {
    let d = |h: &HeaderMap| Directives::of(h);
    // no-cache: zero, and stored without stated freshness only with a
    // validator to revalidate it by.
    let cases: &[(Headers, Option<u64>)] = &[
        (&[("cache-control", "no-cache")], None),
        (&[("cache-control", "no-cache"), ("etag", "\"a\"")], Some(0)),
        (&[("cache-control", "no-cache"), ("last-modified", "Thu, 01 Jan 2099 00:00:00 GMT")], Some(0)),
        (&[("cache-control", "no-cache, max-age=60")], Some(0)),
    ];
    for (fields, want) in cases {
        let h = head(fields);
        assert_eq!(lifetime(&h, &d(&h), Duration::ZERO), want.map(Duration::from_secs), "{fields:?}");
    }
    let h = head(&[("cache-control", "max-age=10, s-maxage=20"), ("expires", "Thu, 01 Jan 2099 00:00:00 GMT")]);
    assert_eq!(lifetime(&h, &d(&h), Duration::ZERO), Some(Duration::from_secs(20)));
    let h = head(&[("cache-control", "max-age=10"), ("expires", "Thu, 01 Jan 2099 00:00:00 GMT")]);
    assert_eq!(lifetime(&h, &d(&h), Duration::ZERO), Some(Duration::from_secs(10)));
    let h = head(&[("date", "Thu, 01 Jan 2099 00:00:00 GMT"), ("expires", "Thu, 01 Jan 2099 00:01:00 GMT")]);
    assert_eq!(lifetime(&h, &d(&h), Duration::from_secs(5)), Some(Duration::from_secs(60)));
    let h = head(&[("expires", "0")]);
    assert_eq!(lifetime(&h, &d(&h), Duration::from_secs(5)), Some(Duration::ZERO));
    let h = head(&[]);
    assert_eq!(lifetime(&h, &d(&h), Duration::from_secs(5)), Some(Duration::from_secs(5)));
    assert_eq!(lifetime(&h, &d(&h), Duration::ZERO), None);
}

#[test]
fn request_directives() {
    assert_eq!(ask(&head(&[])), (Ask::Normal, false, None));
    assert_eq!(ask(&head(&[("cache-control", "no-cache")])), (Ask::Revalidate, false, None));
    assert_eq!(ask(&head(&[("pragma", "no-cache")])), (Ask::Revalidate, false, None));
    assert_eq!(ask(&head(&[("cache-control", "max-age=0")])), (Ask::Revalidate, false, Some(0)));
    assert_eq!(ask(&head(&[("cache-control", "max-age=5")])), (Ask::Normal, false, Some(5)));
    assert_eq!(ask(&head(&[("cache-control", "no-store")])), (Ask::Bypass, false, None));
    assert_eq!(ask(&head(&[("cache-control", "only-if-cached")])), (Ask::Normal, true, None));
}

#[test]
fn conditionals() {
    let stored = head(&[("etag", "\"v1\""), ("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT")]);
    let get = Method::GET;
    assert!(not_modified(&get, &head(&[("if-none-match", "\"v1\"")]), &stored));
    assert!(not_modified(&get, &head(&[("if-none-match", "W/\"v1\", \"v2\"")]), &stored));
    assert!(!not_modified(&get, &head(&[("if-none-match", "\"v2\"")]), &stored));
    assert!(not_modified(&get, &head(&[("if-modified-since", "Wed, 01 Jan 2020 00:00:00 GMT")]), &stored));
    assert!(!not_modified(&get, &head(&[("if-modified-since", "Tue, 01 Jan 2019 00:00:00 GMT")]), &stored));
    // If-None-Match wins over If-Modified-Since.
    let both = head(&[("if-none-match", "\"v2\""), ("if-modified-since", "Wed, 01 Jan 2020 00:00:00 GMT")]);
    assert!(!not_modified(&get, &both, &stored));
}

#[test]
fn vary_values_are_normalised_only_as_their_syntax_allows() {
    let value = |name: &'static str, lines: &[&'static str]| {
        let mut h = HeaderMap::new();
        for line in lines {
            h.append(name, HeaderValue::from_static(line));
        }
        vary_value(&h, &HeaderName::from_static(name))
    };
    // (field, one request's lines, another's, the same key)
    let cases: &[(&str, &[&str], &[&str], bool)] = &[
        ("accept-language", &["en,  fr"], &["en, fr"], true),
        ("accept-language", &[" en ,fr ,, "], &["en,fr"], true),
        ("accept-language", &["en", "fr"], &["en, fr"], true),
        ("accept-language", &["en, fr"], &["fr, en"], false),
        ("accept-language", &["en; q=0.5"], &["en;q=0.5"], false),
        ("accept", &["text/html;a=\"x, y\""], &["text/html;a=\"x,y\""], false),
        ("accept", &["text/html;a=\"x\\\", y\", b"], &["text/html;a=\"x\\\",y\", b"], false),
        ("if-none-match", &["\"a,b\" , \"c\""], &["\"a,b\",\"c\""], true),
        ("user-agent", &["x  y"], &["x y"], false),
        ("user-agent", &["x, y"], &["x,y"], false),
        ("x-custom", &["a", "b"], &["a, b"], true),
        ("x-custom", &["1,2"], &[" 1, 2 "], true),
        ("x-custom", &["a  b"], &["a b"], false),
        ("referer", &["a", "b"], &["a, b"], false),
        ("accept-datetime", &["Thu, 31 May 2007 20:35:00 GMT"], &["Thu,31 May 2007 20:35:00 GMT"], false),
        ("cookie", &["a=1;  b=2"], &["a=1; b=2"], false),
    ];
    for (name, a, b, same) in cases {
        assert_eq!(value(name, a) == value(name, b), *same, "{name}: {a:?} against {b:?}");
    }
    // `Cookie` as the upstream gets it: its lines (an HTTP/2 request's
    // crumbs, an HTTP/1 request's lines) joined with `; `.
    type Side = &'static [&'static str];
    let cookies: &[(Side, Side, bool)] = &[
        (&["a=1", "b=2"], &["a=1; b=2"], true),
        (&["a=1", " ", "b=2"], &["a=1; b=2"], true),
        (&["a=1;  b=2"], &["a=1; b=2"], false),
    ];
    for (a, b, same) in cookies {
        assert_eq!(value("cookie", a) == value("cookie", b), *same, "{a:?} against {b:?}");
    }
    let n = HeaderName::from_static("accept-language");
    assert_eq!(vary_value(&head(&[]), &n), None);
    let bytes = |b: &'static [u8]| {
        let mut h = HeaderMap::new();
        h.insert(n.clone(), http::HeaderValue::from_bytes(b).unwrap());
        vary_value(&h, &n)
    };
    assert_ne!(bytes(b"\xe9"), bytes(b"\xe8"), "values that are not UTF-8 stay apart");
    assert_ne!(bytes(b"\xe9"), bytes(b""));
    let names: Vec<String> = vary_names(&head(&[("vary", " Accept-Language ,ACCEPT")])).collect();
    assert_eq!(names, ["accept-language", "accept"]);
}

#[test]
fn stale_windows() {
    let d = |v| Directives::of(&head(&[("cache-control", v)]));
    assert_eq!(stale_window(&d("max-age=1"), None, Duration::from_secs(5)), Duration::from_secs(5));
    assert_eq!(
        stale_window(&d("max-age=1, stale-if-error=9"), Some(9), Duration::from_secs(5)),
        Duration::from_secs(9)
    );
    assert_eq!(stale_window(&d("max-age=1, must-revalidate"), None, Duration::from_secs(5)), Duration::ZERO);
    assert_eq!(stale_window(&d("s-maxage=1"), None, Duration::from_secs(5)), Duration::ZERO);
    assert_eq!(
        stale_window(&d("s-maxage=1, stale-if-error=7"), Some(7), Duration::from_secs(5)),
        Duration::from_secs(7)
    );
}

/// The RFC's rules, written out apart from the code under test.
#[allow(clippy::too_many_arguments)]
fn expected(
    status: u16,
    max_age: Option<u64>,
    s_maxage: Option<u64>,
    expires: Option<u64>,
    no_store: bool,
    private: bool,
    cookie: bool,
    auth: bool,
    public: bool,
    default_ttl: u64,
) -> (bool, Option<u64>) {
    let life = s_maxage.or(max_age).or(expires).or((default_ttl > 0).then_some(default_ttl));
    let explicit = max_age.is_some() || s_maxage.is_some() || expires.is_some();
    let status_ok =
        [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501].contains(&status) || (explicit && status != 206);
    let auth_ok = !auth || public || s_maxage.is_some();
    let ok = status_ok && !no_store && !private && !cookie && auth_ok && life.is_some();
    (ok, life)
}

proptest! {
    #[test]
    fn freshness_and_storability(
        status in prop::sample::select(vec![200u16, 203, 204, 206, 300, 301, 302, 303, 307, 308, 404, 405, 410, 414, 500, 501, 503]),
        max_age in prop::option::of(0u64..100_000),
        s_maxage in prop::option::of(0u64..100_000),
        expires in prop::option::of(0u64..100_000),
        no_store: bool, private: bool, cookie: bool, auth: bool, public: bool,
        default_ttl in prop::sample::select(vec![0u64, 30]),
    ) {
        let mut cc = Vec::new();
        if let Some(m) = max_age { cc.push(format!("max-age={m}")); }
        if let Some(s) = s_maxage { cc.push(format!("s-maxage={s}")); }
        if no_store { cc.push("no-store".into()); }
        if private { cc.push("private".into()); }
        if public { cc.push("public".into()); }
        let cc = cc.join(", ");
        let mut res: Vec<(&str, &str)> = Vec::new();
        if !cc.is_empty() { res.push(("cache-control", &cc)); }
        if cookie { res.push(("set-cookie", "a=b")); }
        // Expires - Date, with the Date in the future so that the clock
        // plays no part.
        let date = std::time::UNIX_EPOCH + Duration::from_secs(4_070_908_800);
        let (date_text, expires_text) = (httpdate::fmt_http_date(date), expires.map(|e| httpdate::fmt_http_date(date + Duration::from_secs(e))));
        if let Some(e) = &expires_text { res.push(("expires", e)); res.push(("date", &date_text)); }
        let req: Vec<(&str, &str)> = if auth { vec![("authorization", "Basic x")] } else { vec![] };
        let (ok, life) = expected(status, max_age, s_maxage, expires, no_store, private, cookie, auth, public, default_ttl);
        prop_assert_eq!(is_storable(&req, status, &res, default_ttl), ok);
        let h = head(&res);
        let got = lifetime(&h, &Directives::of(&h), Duration::from_secs(default_ttl));
        prop_assert_eq!(got, life.map(Duration::from_secs));
    }
}

#[test]
fn directives_are_parsed_as_the_rfc_says() {
    let d = |v: &str| Directives::of(&head(&[("cache-control", v)]));
    let cases: &[(&str, Option<u64>)] = &[
        ("max-age=5", Some(5)),
        ("max-age=5, max-age=100", Some(5)),
        ("max-age=\"7\"", Some(7)),
        ("community=\"UCI, max-age=3600\"", None),
        ("x=\"a\\\", max-age=9\", max-age=4", Some(4)),
        ("max-age=99999999999999999999", Some(DELTA_MAX)),
        ("max-age=4294967296", Some(DELTA_MAX)),
        ("max-age=2147483647", Some(2147483647)),
        ("max-age=-1", Some(0)),
        ("max-age=soon", Some(0)),
        ("max-age", Some(0)),
        (", ,max-age=3,", Some(3)),
    ];
    for (value, want) in cases {
        assert_eq!(d(value).max_age, *want, "{value}");
    }
    let two = head(&[("cache-control", "max-age=5"), ("cache-control", "max-age=100, no-store")]);
    assert_eq!(Directives::of(&two).max_age, Some(5), "the first line's");
    assert!(Directives::of(&two).no_store);
    assert!(d("private=\"set-cookie, x\"").private);
    assert!(!d("x=\"no-store\"").no_store);
}
