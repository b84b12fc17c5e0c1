//! Tests of the response head encoding (`encode.rs`).

use super::*;

#[test]
fn numbers_are_written_as_format_writes_them() {
    for n in [0u64, 1, 9, 10, 15, 16, 255, 4096, 123_456_789, u64::MAX] {
        let mut buf = [0u8; 20];
        assert_eq!(number(n, 10, &mut buf), n.to_string().as_bytes());
        assert_eq!(number(n, 16, &mut buf), format!("{n:X}").as_bytes());
    }
}

fn encode(
    resp: http::Response<()>,
    body: BodyLength,
    method: Method,
    version: Version,
    keep: bool,
) -> (String, Encoder, bool) {
    let (mut parts, ()) = resp.into_parts();
    let mut out = BytesMut::new();
    let asked = Asked { method: &method, version, keep_alive: keep };
    let (encoder, last) = head(&mut parts, body, asked, None, &mut out);
    let text = String::from_utf8(out.to_vec()).unwrap();
    let text = text.lines().filter(|l| !l.starts_with("date: ")).collect::<Vec<_>>().join("|");
    (text, encoder, last)
}

/// A response, its body's length, the request's method and version,
/// keep-alive; the head written (without `date`), encoder, last.
type Case = (http::Response<()>, BodyLength, Method, Version, bool, &'static str, Encoder, bool);

#[test]
fn framing_follows_hyper() {
    use BodyLength::*;
    let ok = || http::Response::builder().status(200);
    let get = Method::GET;
    let cases: Vec<Case> = vec![
        (
            ok().body(()).unwrap(),
            Known(5),
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|content-length: 5|",
            Encoder::Length(5),
            false,
        ),
        (
            ok().body(()).unwrap(),
            Unknown,
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|transfer-encoding: chunked|",
            Encoder::Chunked(vec![]),
            false,
        ),
        (
            ok().body(()).unwrap(),
            Unknown,
            get.clone(),
            Version::HTTP_10,
            true,
            "HTTP/1.0 200 OK|connection: keep-alive|",
            Encoder::Close,
            true,
        ),
        (
            ok().version(Version::HTTP_10).body(()).unwrap(),
            Unknown,
            get.clone(),
            Version::HTTP_10,
            true,
            "HTTP/1.0 200 OK|",
            Encoder::Close,
            true,
        ),
        (
            ok().header("connection", "close").body(()).unwrap(),
            Known(2),
            get.clone(),
            Version::HTTP_10,
            true,
            "HTTP/1.0 200 OK|connection: close|content-length: 2|",
            Encoder::Length(2),
            true,
        ),
        (
            ok().body(()).unwrap(),
            None,
            get.clone(),
            Version::HTTP_11,
            false,
            "HTTP/1.1 200 OK|connection: close|content-length: 0|",
            Encoder::Length(0),
            true,
        ),
        (
            ok().header("content-length", "9").body(()).unwrap(),
            None,
            Method::HEAD,
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|content-length: 9|",
            Encoder::Length(0),
            false,
        ),
        (
            ok().body(()).unwrap(),
            Known(9),
            Method::HEAD,
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|content-length: 9|",
            Encoder::Length(0),
            false,
        ),
        (
            http::Response::builder().status(204).body(()).unwrap(),
            None,
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 204 No Content|",
            Encoder::Length(0),
            false,
        ),
        (
            http::Response::builder().status(304).body(()).unwrap(),
            Known(3),
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 304 Not Modified|",
            Encoder::Length(0),
            false,
        ),
        (
            http::Response::builder().status(101).header("upgrade", "websocket").body(()).unwrap(),
            None,
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 101 Switching Protocols|upgrade: websocket|",
            Encoder::Length(0),
            true,
        ),
        (
            ok().header("trailer", "x-sum").body(()).unwrap(),
            Unknown,
            get.clone(),
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|trailer: x-sum|transfer-encoding: chunked|",
            Encoder::Chunked(vec![HeaderName::from_static("x-sum")]),
            false,
        ),
        (
            ok().header("connection", "close").body(()).unwrap(),
            Known(1),
            get,
            Version::HTTP_11,
            true,
            "HTTP/1.1 200 OK|connection: close|content-length: 1|",
            Encoder::Length(1),
            true,
        ),
    ];
    for (resp, body, method, version, keep, want, encoder, last) in cases {
        let got = encode(resp, body, method.clone(), version, keep);
        assert_eq!(got, (want.to_string(), encoder, last), "{want}");
    }
}

#[test]
fn chunks_and_trailers() {
    let mut out = BytesMut::new();
    chunk(&mut out, b"hello world, this is 26 b.");
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", HeaderValue::from_static("1"));
    trailers.insert("x-other", HeaderValue::from_static("2"));
    last_chunk(&mut out, Some(&trailers), &[HeaderName::from_static("x-sum")]);
    assert_eq!(&out[..], b"1A\r\nhello world, this is 26 b.\r\n0\r\nx-sum: 1\r\n\r\n");
}

/// An upstream's 1xx head as the client gets it: hop-by-hop fields, those
/// its `Connection` field names and `TE` are dropped (RFC 9110 §7.6.1).
#[test]
fn interim_heads_lose_their_connection_fields() {
    let cases: &[(&str, &str)] = &[
        (
            "HTTP/1.1 103 Early Hints\r\nLink: <a>\r\nLink: <b>\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nlink: <a>\r\nlink: <b>\r\n\r\n",
        ),
        (
            "HTTP/1.1 103 Early Hints\r\nConnection: X-Hint\r\nX-Hint: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nLink: <a>\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nlink: <a>\r\n\r\n",
        ),
        ("HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n"),
        // The upstream's reason, as with a final head; without one, the usual.
        ("HTTP/1.1 199 Whatever\r\nX-A: 1\r\n\r\n", "HTTP/1.1 199 Whatever\r\nx-a: 1\r\n\r\n"),
        ("HTTP/1.1 103 Hints, soon\r\n\r\n", "HTTP/1.1 103 Hints, soon\r\n\r\n"),
        ("HTTP/1.1 103 \r\n\r\n", "HTTP/1.1 103 Early Hints\r\n\r\n"),
        ("HTTP/1.1 200 OK\r\n\r\n", ""),
        ("HTTP/1.1 103 Early", ""),
    ];
    for (raw, want) in cases {
        let mut out = BytesMut::new();
        interim(raw.as_bytes(), &mut out, true);
        assert_eq!(String::from_utf8_lossy(&out), *want, "{raw:?}");
    }
}

/// A request ID given to the encoder is the head's one `x-request-id`,
/// after the map's fields: any in the map (the upstream's own) is left
/// out, as the insert it stands for would have replaced it.
#[test]
fn a_given_request_id_is_the_only_one_written() {
    let id = HeaderValue::from_static("r-42");
    let heads = |resp: http::Response<()>| {
        let (mut parts, ()) = resp.into_parts();
        let asked = Asked { method: &Method::GET, version: Version::HTTP_11, keep_alive: true };
        let (mut with, mut without) = (BytesMut::new(), BytesMut::new());
        head(&mut parts.clone(), BodyLength::Known(2), asked, Some(&id), &mut with);
        head(&mut parts, BodyLength::Known(2), asked, None, &mut without);
        let text = |out: BytesMut| {
            String::from_utf8(out.to_vec())
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with("date: "))
                .collect::<Vec<_>>()
                .join("|")
        };
        (text(with), text(without))
    };
    let ok = || http::Response::builder().status(200).header("via", "1.1 a");
    let (with, without) = heads(ok().body(()).unwrap());
    assert_eq!(with, "HTTP/1.1 200 OK|via: 1.1 a|x-request-id: r-42|content-length: 2|");
    assert_eq!(without, "HTTP/1.1 200 OK|via: 1.1 a|content-length: 2|");
    let upstreams = ok().header("X-Request-Id", "theirs").header("x-request-id", "again").header("server", "s");
    let (with, without) = heads(upstreams.body(()).unwrap());
    assert_eq!(with, "HTTP/1.1 200 OK|via: 1.1 a|server: s|x-request-id: r-42|content-length: 2|");
    assert_eq!(
        without,
        "HTTP/1.1 200 OK|via: 1.1 a|x-request-id: theirs|x-request-id: again|server: s|content-length: 2|"
    );
}
