//! Table tests of the header rules in `headers`.

use super::*;

type Pairs<'a> = &'a [(&'a str, &'a str)];

fn map(pairs: Pairs) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

/// The gateway's `Via`, under the name the tables expect.
/// [`add_forwarding`], its stamped fields then put into the map as an
/// HTTP/2 upstream gets them. A stamped field is one the map lacks.
fn forward(
    h: &mut HeaderMap,
    ip: &HeaderValue,
    host: Option<&HeaderValue>,
    via: &Via,
    version: Version,
    trusted: bool,
    https: bool,
) -> bool {
    let mut stamp = Stamp::default();
    let looped = add_forwarding(h, ip, host, via, version, trusted, https, &mut stamp);
    for (name, _) in stamp.iter() {
        assert!(!h.contains_key(name), "{name} both in the map and stamped");
    }
    stamp.insert_into(h);
    looped
}

fn via() -> Via {
    Via::new("gateway").unwrap()
}

fn names(h: &HeaderMap) -> Vec<String> {
    let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
    n.sort();
    n
}

#[test]
fn strips_fixed_and_connection_named_headers() {
    let cases: &[(Pairs, &[&str])] = &[
        (&[("connection", "close"), ("content-type", "text/plain")], &["content-type"]),
        (
            &[("connection", "X-Secret, keep-alive"), ("x-secret", "1"), ("keep-alive", "timeout=5"), ("x-ok", "1")],
            &["x-ok"],
        ),
        (&[("connection", "x-a"), ("connection", "X-B"), ("x-a", "1"), ("x-b", "2"), ("x-c", "3")], &["x-c"]),
        (
            &[
                ("te", "gzip"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "websocket"),
                ("proxy-authorization", "Basic x"),
                ("proxy-authenticate", "Basic"),
                ("proxy-connection", "keep-alive"),
                ("host", "h"),
            ],
            &["host"],
        ),
        // Trailer is end-to-end; TE keeps only its `trailers` member.
        (&[("te", "gzip, Trailers;q=0.5"), ("trailer", "x-sum")], &["te", "trailer"]),
        (&[("te", "gzip"), ("te", "trailers")], &["te"]),
        (&[("connection", "bad header name!, x-a"), ("x-a", "1")], &[]),
        (&[("connection", "Host, x-a"), ("host", "h"), ("x-a", "1")], &["host"]),
        (&[("x-forwarded-for", "1.2.3.4")], &["x-forwarded-for"]),
        // The gateway answers an expectation itself: never passed on.
        (&[("expect", "100-continue"), ("content-length", "5")], &["content-length"]),
        (&[("expect", "something-else")], &[]),
    ];
    for (input, want) in cases {
        let mut h = map(input);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), *want, "{input:?}");
        if let Some(te) = h.get(header::TE) {
            assert_eq!(te, "trailers");
        }
    }
}

#[test]
fn nominated_headers_go_early_and_leave_connection_with_the_rest() {
    // (input, names left, Connection left)
    let cases: &[(Pairs, &[&str], Option<&str>)] = &[
        (&[("x-user", "u")], &["x-user"], None),
        (&[("connection", "x-user"), ("x-user", "u")], &[], None),
        (
            &[("connection", "Upgrade, X-User"), ("x-user", "u"), ("upgrade", "websocket")],
            &["connection", "upgrade"],
            Some("Upgrade"),
        ),
        (
            &[("connection", "close"), ("connection", "x-a, , x-b"), ("x-a", "1"), ("x-b", "2")],
            &["connection"],
            Some("close"),
        ),
        (&[("connection", "keep-alive, te"), ("te", "trailers")], &["connection", "te"], Some("keep-alive, te")),
        (&[("connection", "host"), ("host", "h")], &["connection", "host"], Some("host")),
        (&[("connection", "close")], &["connection"], Some("close")),
    ];
    for (input, want, connection) in cases {
        let mut h = map(input);
        drop_nominated(&mut h);
        assert_eq!(names(&h), *want, "{input:?}");
        assert_eq!(h.get(header::CONNECTION).map(|v| v.to_str().unwrap()), *connection, "{input:?}");
        // Whatever the gateway adds after this survives the last strip.
        h.insert(HeaderName::from_static("x-user"), HeaderValue::from_static("ann"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get("x-user").unwrap(), "ann", "{input:?}");
    }
}

#[test]
fn upgrade_is_requested_only_with_connection_upgrade_and_never_h2c() {
    let cases: &[(Pairs, Option<&str>)] = &[
        (&[("connection", "Upgrade"), ("upgrade", "websocket")], Some("websocket")),
        (&[("connection", "keep-alive, upgrade"), ("upgrade", "WebSocket")], Some("WebSocket")),
        (&[("connection", "x-a"), ("connection", "UPGRADE"), ("upgrade", "foo/2")], Some("foo/2")),
        // Upgrade alone is not a request to upgrade (RFC 9110 §7.8).
        (&[("upgrade", "websocket")], None),
        (&[("connection", "keep-alive"), ("upgrade", "websocket")], None),
        (&[("connection", "upgrade")], None),
        (&[("connection", "upgrade"), ("upgrade", "")], None),
        (&[("connection", "upgrade"), ("upgrade", "websocket"), ("upgrade", "x")], None),
        (&[("connection", "upgrade"), ("upgrade", "h2c")], None),
        (&[("connection", "upgrade"), ("upgrade", "websocket, H2C")], Some("websocket")),
        (&[("connection", "upgrade"), ("upgrade", "h2c, foo/2, ,h2c/1")], Some("foo/2")),
        (&[("connection", "upgrade"), ("upgrade", "h2c, h2c")], None),
        (&[("connection", "upgrade"), ("upgrade", "h2c/1")], None),
    ];
    for (input, want) in cases {
        let got = upgrade_requested(&map(input));
        assert_eq!(got.as_ref().map(|v| v.to_str().unwrap()), *want, "{input:?}");
    }
}

#[test]
fn a_101_may_switch_only_to_a_protocol_asked_for() {
    let cases: &[(&str, Option<&str>, bool)] = &[
        ("websocket", Some("websocket"), true),
        ("websocket", Some("WebSocket"), true),
        ("foo/2, websocket", Some("websocket"), true),
        ("websocket", Some("h2c"), false),
        ("websocket", Some("websocket, h2c"), false),
        ("websocket", Some(""), false),
        ("websocket", None, false),
        ("foo/2", Some("foo"), false),
    ];
    for (asked, answered, want) in cases {
        let answered = answered.map(HeaderValue::from_static);
        assert_eq!(
            upgrade_accepted(&HeaderValue::from_static(asked), answered.as_ref()),
            *want,
            "{asked} / {answered:?}"
        );
    }
}

#[test]
fn hosts_are_host_and_port_only() {
    let ok = ["example.com", "example.com:8080", "127.0.0.1:1", "[::1]:80", "[::1]", "[v1.x]", "xn--bcher-kva.example"];
    for ok in ok.into_iter().chain(["a_b", "h:"]) {
        assert!(valid_host(ok.as_bytes()), "{ok}");
    }
    let shapes =
        ["h:80:80", "h:port", "[::1", "::1", "h]:80", "[]", "[::1]x", "[::1]:8a", "[[::1]]", "h[1]", "h:8]", ""];
    for bad in
        ["a b", "a/b", "a?b", "a#b", "user@host", "h\\x", "h\"q", "caf\u{e9}.example", "a\tb"].into_iter().chain(shapes)
    {
        assert!(!valid_host(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn cookies_join_into_one_field() {
    let cases: &[(Pairs, Option<&str>)] = &[
        (&[], None),
        (&[("cookie", "a=1")], Some("a=1")),
        (&[("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")], Some("a=1; b=2; c=3")),
    ];
    for (input, want) in cases {
        let mut h = map(input);
        join_cookies(&mut h);
        assert!(h.get_all(header::COOKIE).iter().count() <= 1);
        assert_eq!(h.get(header::COOKIE).map(|v| v.to_str().unwrap()), *want, "{input:?}");
    }
}

#[test]
fn forwarding_headers_append_and_set() {
    // (input, client Host, version, trusted, want XFF, XFP, XFH, Forwarded, Via)
    type Case<'a> = (Pairs<'a>, Option<&'a str>, Version, bool, [Option<&'a str>; 5]);
    let cases: &[Case] = &[
        (
            &[],
            Some("example.com"),
            Version::HTTP_11,
            false,
            [Some("10.0.0.1"), Some("http"), Some("example.com"), None, Some("1.1 gateway")],
        ),
        (
            &[("x-forwarded-for", "1.1.1.1"), ("via", "1.0 edge")],
            Some("h:8080"),
            Version::HTTP_10,
            false,
            [Some("1.1.1.1, 10.0.0.1"), Some("http"), Some("h:8080"), None, Some("1.0 edge, 1.0 gateway")],
        ),
        (
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2"),
                ("x-forwarded-host", "spoofed"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=6.6.6.6"),
            ],
            None,
            Version::HTTP_2,
            false,
            [
                Some("1.1.1.1, 2.2.2.2, 10.0.0.1"),
                Some("http"),
                None,
                Some("for=10.0.0.1;proto=http"),
                Some("2 gateway"),
            ],
        ),
        (
            &[("x-forwarded-host", "public.example"), ("x-forwarded-proto", "https"), ("forwarded", "for=6.6.6.6")],
            Some("app:8080"),
            Version::HTTP_11,
            true,
            [
                Some("10.0.0.1"),
                Some("https"),
                Some("public.example"),
                Some("for=6.6.6.6, for=10.0.0.1;proto=http;host=\"app:8080\""),
                Some("1.1 gateway"),
            ],
        ),
        // Empty lines add no empty element.
        (
            &[("x-forwarded-for", ""), ("via", " ")],
            Some("h"),
            Version::HTTP_11,
            false,
            [Some("10.0.0.1"), Some("http"), Some("h"), None, Some("1.1 gateway")],
        ),
        (
            &[("x-forwarded-for", "1.1.1.1"), ("x-forwarded-for", " "), ("via", "1.0 edge"), ("via", "")],
            Some("h"),
            Version::HTTP_11,
            false,
            [Some("1.1.1.1, 10.0.0.1"), Some("http"), Some("h"), None, Some("1.0 edge, 1.1 gateway")],
        ),
        // Trusted, each sent on two lines: the last line of each, the one
        // the trusted proxy added after what its client sent, and one line.
        (
            &[
                ("x-forwarded-proto", "http"),
                ("x-forwarded-host", "spoofed.example"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "public.example"),
            ],
            Some("app"),
            Version::HTTP_11,
            true,
            [Some("10.0.0.1"), Some("https"), Some("public.example"), None, Some("1.1 gateway")],
        ),
        // Trusted, but nothing to keep: this hop's own values.
        (
            &[],
            Some("app"),
            Version::HTTP_11,
            true,
            [Some("10.0.0.1"), Some("http"), Some("app"), None, Some("1.1 gateway")],
        ),
    ];
    for (input, host, version, trusted, want) in cases {
        let mut h = map(input);
        let host = host.map(HeaderValue::from_static);
        let ip = forwarded_for("10.0.0.1".parse().unwrap());
        assert!(!forward(&mut h, &ip, host.as_ref(), &via(), *version, *trusted, false));
        let got = [X_FORWARDED_FOR, X_FORWARDED_PROTO, X_FORWARDED_HOST, FORWARDED, header::VIA].map(|n| {
            assert!(h.get_all(&n).iter().count() <= 1, "{n} repeated");
            h.get(&n).map(|v| v.to_str().unwrap().to_owned())
        });
        assert_eq!(got.each_ref().map(|v| v.as_deref()), *want, "{input:?} trusted={trusted}");
    }
}

#[test]
fn underscore_spellings_of_the_forwarding_headers_are_dropped() {
    let ip = forwarded_for("10.0.0.1".parse().unwrap());
    for trusted in [false, true] {
        let mut h = map(&[
            ("accept", "*/*"),
            ("x_forwarded_proto", "https"),
            ("x_forwarded_for", "6.6.6.6"),
            ("x_forwarded_host", "evil.example"),
        ]);
        assert!(!forward(&mut h, &ip, None, &via(), Version::HTTP_11, trusted, false));
        let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert!(!names.iter().any(|n| n.contains('_')), "trusted={trusted}: {names:?}");
        assert_eq!(h.get(header::ACCEPT).unwrap(), "*/*");
    }
}

#[test]
fn a_client_on_tls_is_forwarded_as_https() {
    let ip = forwarded_for("10.0.0.1".parse().unwrap());
    // Untrusted: its own claim is replaced by this hop's https.
    let mut h = map(&[("x-forwarded-proto", "http"), ("forwarded", "for=1.1.1.1;proto=http")]);
    assert!(!forward(&mut h, &ip, None, &via(), Version::HTTP_11, false, true));
    assert_eq!(h.get(X_FORWARDED_PROTO).unwrap(), "https");
    assert_eq!(h.get(FORWARDED).unwrap(), "for=10.0.0.1;proto=https");
}

#[test]
fn a_request_that_passed_here_changes_nothing() {
    let ip = forwarded_for("10.0.0.1".parse().unwrap());
    for seen in ["1.1 gateway", "1.0 edge, 1.1 GATEWAY (x)"] {
        let mut h = map(&[("via", seen), ("x-forwarded-for", "1.1.1.1")]);
        let before = h.clone();
        assert!(forward(&mut h, &ip, None, &via(), Version::HTTP_11, false, false), "{seen}");
        assert_eq!(h, before);
    }
    // Another gateway's entry is one more hop.
    let mut h = map(&[("via", "1.1 gateway-0badcafe")]);
    assert!(!forward(&mut h, &ip, None, &via(), Version::HTTP_11, false, false));
    assert_eq!(h.get(header::VIA).unwrap(), "1.1 gateway-0badcafe, 1.1 gateway");
}

/// A client's address as `X-Forwarded-For` writes it: what `Display` writes.
#[test]
fn forwarded_for_writes_addresses_as_display_does() {
    // Every octet in every place, and IPv6.
    let v4 = (0..=255u8).flat_map(|o| [[o, 0, 0, 0], [1, o, 0, 0], [10, 0, o, 0], [127, 0, 0, o]]);
    let mut ips: Vec<std::net::IpAddr> = v4.map(|o| std::net::Ipv4Addr::from(o).into()).collect();
    ips.extend(["2001:db8::1", "::1", "::ffff:10.0.0.1"].map(|t| t.parse::<std::net::IpAddr>().unwrap()));
    for ip in ips {
        assert_eq!(forwarded_for(ip), ip.to_string().as_str());
    }
}

#[test]
fn forwarded_element_quotes_ipv6_and_ports() {
    let v6 = forwarded_for("2001:db8::1".parse().unwrap());
    let host = HeaderValue::from_static("[::1]:8080");
    assert_eq!(forwarded_element(&v6, Some(&host), false), "for=\"[2001:db8::1]\";proto=http;host=\"[::1]:8080\"");
}

/// One pass for hop-by-hop fields and `Via` gives the map the two calls
/// give, whatever the response carries.
#[test]
fn strip_then_via_in_one_pass_matches_the_two_calls() {
    let cases: &[&[(&str, &str)]] = &[
        &[("content-length", "5")],
        &[("via", "1.1 up"), ("content-type", "text/plain")],
        &[("via", "1.0 a"), ("via", "1.1 b")],
        &[("connection", "keep-alive, x-secret"), ("x-secret", "1"), ("keep-alive", "timeout=5")],
        &[("connection", "via"), ("via", "1.1 up")],
        &[("upgrade", "h2c"), ("te", "trailers, deflate"), ("transfer-encoding", "chunked"), ("via", "1.1 up")],
    ];
    for fields in cases {
        for version in [Version::HTTP_10, Version::HTTP_11] {
            let (mut one, mut two) = (map(fields), map(fields));
            strip_hop_by_hop_then_via(&mut one, &via(), version);
            strip_hop_by_hop(&mut two);
            append_via(&mut two, &via(), version);
            assert_eq!(one, two, "{fields:?} {version:?}");
        }
    }
}
