//! File and directory routes end to end: validators, conditional requests,
//! ranges, changes on disk, and the traversal battery.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Site {
    dir: tempfile::TempDir,
    gw: TestGateway,
}

/// A root with files, a secret outside it, and symlinks pointing in and out.
async fn site() -> Site {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("hello.txt"), "hello, file\n").unwrap();
    std::fs::write(root.join("sub/page.html"), "<p>page</p>").unwrap();
    std::fs::write(root.join("sub/index.html"), "<p>index</p>").unwrap();
    std::fs::write(root.join("big.bin"), vec![7u8; 1024 * 1024]).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "TOP SECRET").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("escape.txt")).unwrap();
    std::os::unix::fs::symlink(root.join("hello.txt"), root.join("inside.txt")).unwrap();
    let toml = r#"
[[routes]]
name = "static"
prefix = "/static"
dir = "root"

[[routes]]
name = "one"
prefix = "/one"
file = "root/hello.txt"
"#;
    let gw = TestGateway::start(config(toml, dir.path())).await;
    Site { dir, gw }
}

async fn get_with(url: &str, headers: &[(&str, &str)]) -> (http::response::Parts, Bytes) {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(full(Bytes::new())).unwrap()).await
}

#[tokio::test]
async fn file_get_head_validators_and_conditionals() {
    let s = site().await;
    let (parts, body) = get(&s.gw.url("/one")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(&body[..], b"hello, file\n");
    assert_eq!(parts.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(parts.headers["content-length"], "12");
    let etag = parts.headers["etag"].to_str().unwrap().to_owned();
    let last_modified = parts.headers["last-modified"].to_str().unwrap().to_owned();

    let (head, body) = send(Request::head(s.gw.url("/one")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-length"], "12");
    assert!(body.is_empty());

    let (parts, body) = get_with(&s.gw.url("/one"), &[("if-none-match", &etag)]).await;
    assert_eq!(parts.status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (parts, _) = get_with(&s.gw.url("/one"), &[("if-modified-since", &last_modified)]).await;
    assert_eq!(parts.status, StatusCode::NOT_MODIFIED);
    let (parts, _) = get_with(&s.gw.url("/one"), &[("if-none-match", "\"stale\"")]).await;
    assert_eq!(parts.status, 200);

    let (parts, _) = send(Request::post(s.gw.url("/one")).body(full("x")).unwrap()).await;
    assert_eq!(parts.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(parts.headers["allow"], "GET, HEAD");
    // A file route is that file only.
    assert_eq!(get(&s.gw.url("/one/other")).await.0.status, 404);
}

#[tokio::test]
async fn ranges_give_206_or_416() {
    let s = site().await;
    let (parts, body) = get_with(&s.gw.url("/one"), &[("range", "bytes=0-4")]).await;
    assert_eq!(parts.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&body[..], b"hello");
    assert_eq!(parts.headers["content-range"], "bytes 0-4/12");
    let (parts, body) = get_with(&s.gw.url("/one"), &[("range", "bytes=-5")]).await;
    assert_eq!(parts.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&body[..], b"file\n");
    let (parts, _) = get_with(&s.gw.url("/one"), &[("range", "bytes=100-200")]).await;
    assert_eq!(parts.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(parts.headers["content-range"], "bytes */12");
    // A range of a file too large for the cache is streamed from disk.
    let (parts, body) = get_with(&s.gw.url("/static/big.bin"), &[("range", "bytes=1000-1999")]).await;
    assert_eq!(parts.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(body.len(), 1000);
    let (parts, body) = get(&s.gw.url("/static/big.bin")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(body.len(), 1024 * 1024);
    assert!(body.iter().all(|b| *b == 7));
}

/// `If-Range` with a date (RFC 9110 §13.1.5): only a strong date, one at
/// least a second before the answer's `Date` (§8.8.2.2), keeps the range;
/// a file modified in the second it is answered in could change again
/// under the same `Last-Modified`, so the whole file is sent.
#[tokio::test]
async fn if_range_takes_a_date_only_when_it_is_strong() {
    let s = site().await;
    let path = s.dir.path().join("root/fresh.txt");
    let url = s.gw.url("/static/fresh.txt");
    // A file changed this second: retried until two answers fall in the
    // second of its `Last-Modified`.
    let mut checked = false;
    for attempt in 0..20 {
        std::fs::write(
            &path,
            format!(
                "version {attempt}
"
            ),
        )
        .unwrap();
        let (parts, _) = get(&url).await;
        let lm = parts.headers["last-modified"].to_str().unwrap().to_owned();
        let (parts, body) = get_with(&url, &[("range", "bytes=0-3"), ("if-range", &lm)]).await;
        if parts.headers["date"] != lm.as_str() {
            continue;
        }
        assert_eq!(parts.status, 200, "a same-second date is weak");
        assert_eq!(&body[..], format!("version {attempt}\n").as_bytes());
        checked = true;
        break;
    }
    assert!(checked, "never answered in the file's second");
    // A file older than its answer: the date is strong.
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
    let (parts, _) = get(&url).await;
    let lm = parts.headers["last-modified"].to_str().unwrap().to_owned();
    let (parts, body) = get_with(&url, &[("range", "bytes=0-3"), ("if-range", &lm)]).await;
    assert_eq!(parts.status, 206);
    assert_eq!(&body[..], b"vers");
    let (parts, _) = get_with(&url, &[("range", "bytes=0-3"), ("if-range", "Sun, 06 Nov 1994 08:49:37 GMT")]).await;
    assert_eq!(parts.status, 200);
}

#[tokio::test]
async fn cached_file_follows_changes_on_disk() {
    let s = site().await;
    let path = s.dir.path().join("root/hello.txt");
    let (first, body) = get(&s.gw.url("/one")).await;
    assert_eq!(&body[..], b"hello, file\n");
    // Same length, new content: the ETag and content must change.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&path, "HELLO, FILE\n").unwrap();
    let (second, body) = get(&s.gw.url("/one")).await;
    assert_eq!(&body[..], b"HELLO, FILE\n");
    assert_ne!(first.headers["etag"], second.headers["etag"]);
    // Replaced by rename (a new inode), as deploy tools do.
    let tmp = s.dir.path().join("root/hello.tmp");
    std::fs::write(&tmp, "replaced\n").unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let (_, body) = get(&s.gw.url("/one")).await;
    assert_eq!(&body[..], b"replaced\n");
    std::fs::remove_file(&path).unwrap();
    assert_eq!(get(&s.gw.url("/one")).await.0.status, 404);
}

#[tokio::test]
async fn directory_routes_serve_tree_and_index() {
    let s = site().await;
    let (parts, body) = get(&s.gw.url("/static/sub/page.html")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(&body[..], b"<p>page</p>");
    assert_eq!(parts.headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(&get(&s.gw.url("/static/sub/")).await.1[..], b"<p>index</p>");
    assert_eq!(&get(&s.gw.url("/static/inside.txt")).await.1[..], b"hello, file\n");
    assert_eq!(get(&s.gw.url("/static/missing.txt")).await.0.status, 404);
    assert_eq!(get(&s.gw.url("/static/sp%20ace")).await.0.status, 404);
}

#[tokio::test]
async fn a_directory_without_its_trailing_slash_is_redirected() {
    let s = site().await;
    for (target, location) in [
        ("/static/sub", "/static/sub/"),
        ("/static/sub?x=1&y=2", "/static/sub/?x=1&y=2"),
        ("/static", "/static/"),
        ("/static//sub", "/static/sub/"),
    ] {
        let (status, text) = raw_status(s.gw.addr, target).await;
        assert_eq!(status, 301, "{target}: {text}");
        let lower = text.to_ascii_lowercase();
        assert!(lower.contains(&format!("\r\nlocation: {location}\r\n")), "{target}: {text}");
        assert!(!text.contains("<p>index</p>"), "{target}: the index must not be served at the slashless URL");
    }
    // Files are not redirected, and a file is not found at a directory's URL.
    assert_eq!(raw_status(s.gw.addr, "/static/sub/page.html").await.0, 200);
    assert_eq!(raw_status(s.gw.addr, "/static/sub/page.html/").await.0, 404);
    assert_eq!(raw_status(s.gw.addr, "/static/hello.txt/").await.0, 404);
    // The slash form serves the index.
    assert!(raw_status(s.gw.addr, "/static/sub/").await.1.ends_with("<p>index</p>"));
}

#[tokio::test]
async fn a_redirect_never_points_at_another_host() {
    // With merge_slashes off, a path starting `//` would make a Location
    // that browsers read as protocol-relative: `//evil.example/`.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("root/evil.example")).unwrap();
    let toml = "[server]\nmerge_slashes = false\n[[routes]]\nname = \"all\"\nprefix = \"/\"\ndir = \"root\"\n";
    let gw = TestGateway::start(config(toml, dir.path())).await;
    let (status, text) = raw_status(gw.addr, "//evil.example").await;
    assert_eq!(status, 301, "{text}");
    let location = text.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("location: ").map(str::to_owned));
    let location = location.expect("a Location");
    assert!(location.starts_with('/') && !location.starts_with("//"), "{location}");
    assert!(!location.starts_with("/\\"), "{location}");
}

/// Sends a raw request line, so that no client normalises the path first.
async fn raw_status(addr: std::net::SocketAddr, target: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

/// A file name on Linux is bytes: a percent-encoded name that is not
/// UTF-8 (`%E9.txt`, Latin-1 "é.txt") names the file of those bytes, and
/// one that is absent is 404, as nginx answers; an encoded slash,
/// backslash or NUL beside such bytes is still refused.
#[tokio::test]
async fn a_name_that_is_not_utf8_names_those_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let s = site().await;
    let root = s.dir.path().join("root");
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"\xe9.txt")), "latin-1\n").unwrap();
    std::fs::write(root.join("\u{e9}.txt"), "utf-8\n").unwrap();
    std::fs::create_dir(root.join(std::ffi::OsStr::from_bytes(b"d\xff"))).unwrap();
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"d\xff/in.txt")), "inside\n").unwrap();
    for (target, want) in [
        ("/static/%E9.txt", "latin-1\n"),
        ("/static/%e9.txt", "latin-1\n"),
        ("/static/%C3%A9.txt", "utf-8\n"),
        ("/static/d%FF/in.txt", "inside\n"),
    ] {
        let (status, text) = raw_status(s.gw.addr, target).await;
        assert_eq!(status, 200, "{target}: {text}");
        assert!(text.ends_with(want), "{target}: {text}");
    }
    for (target, want) in [
        ("/static/%E8.txt", 404),
        ("/static/%E9.txt/", 404),
        ("/static/d%FF", 301),
        ("/static/%E9%2f..%2fsecret.txt", 400),
        ("/static/%E9%5c..%5csecret.txt", 400),
        ("/static/%E9%00", 400),
    ] {
        let (status, text) = raw_status(s.gw.addr, target).await;
        assert_eq!(status, want, "{target}: {text}");
        assert!(!text.contains("TOP SECRET"), "{target} leaked the secret");
    }
}

#[tokio::test]
async fn traversal_attempts_never_read_outside_the_root() {
    let s = site().await;
    let long = format!("/static/{}", "a/".repeat(2000));
    let long_name = format!("/static/{}", "b".repeat(5000));
    let long_dots = format!("/static/{}etc/passwd", "../".repeat(50));
    let attempts = [
        "/static/../secret.txt",
        "/static/..%2fsecret.txt",
        "/static/%2e%2e/secret.txt",
        "/static/%2E%2E/secret.txt",
        "/static/.%2e/secret.txt",
        "/static/%2e%2e%2fsecret.txt",
        "/static/sub/../../secret.txt",
        "/static/..\\secret.txt",
        "/static/%5c..%5csecret.txt",
        "/static/%00/secret.txt",
        "/static/secret.txt%00.html",
        "/static/%252e%252e/secret.txt",
        "/static/escape.txt",
        "/static//../secret.txt",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/%c0%ae%c0%ae/secret.txt",
        "/static/%",
        "/static/%zz",
        "/one/../secret.txt",
        long.as_str(),
        long_name.as_str(),
        long_dots.as_str(),
    ];
    for target in attempts {
        let (status, text) = raw_status(s.gw.addr, target).await;
        assert!(matches!(status, 400 | 404), "{target} gave {status}");
        assert!(!text.contains("TOP SECRET"), "{target} leaked the secret");
        assert!(!text.contains("root:"), "{target} leaked /etc/passwd");
    }
    // The gateway still serves afterwards.
    assert_eq!(get(&s.gw.url("/static/hello.txt")).await.0.status, 200);
}

/// `If-Match` and `If-Unmodified-Since` (RFC 9110 §13.1.1, §13.1.4), before
/// `If-None-Match` and ranges (§13.2.2): a failed one is 412, on a cached
/// file, a streamed one, a HEAD, and a compressed form (made or not yet).
#[tokio::test]
async fn failed_preconditions_are_412() {
    let s = site().await;
    let text = "a line of text that compresses well\n".repeat(100);
    std::fs::write(s.dir.path().join("root/long.txt"), &text).unwrap();
    let toml = "[[routes]]\nname = \"z\"\nprefix = \"/z\"\ndir = \"root\"\ncompress = true\n";
    let zipped = TestGateway::start(config(toml, s.dir.path())).await;
    let (parts, _) = get(&s.gw.url("/one")).await;
    let etag = parts.headers["etag"].to_str().unwrap().to_owned();
    let last_modified = parts.headers["last-modified"].to_str().unwrap().to_owned();
    let long_ago = "Sun, 06 Nov 1994 08:49:37 GMT";
    // Path, request fields, status.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16);
    let cases: &[Case] = &[
        ("/one", &[("if-match", &etag)], 200),
        ("/one", &[("if-match", "*")], 200),
        ("/one", &[("if-match", "\"nope\"")], 412),
        ("/one", &[("if-match", &format!("W/{etag}"))], 412),
        ("/one", &[("if-match", "\"nope\""), ("if-none-match", &etag)], 412),
        ("/one", &[("if-match", "\"nope\""), ("range", "bytes=0-4")], 412),
        ("/one", &[("if-match", &etag), ("range", "bytes=0-4")], 206),
        ("/one", &[("if-unmodified-since", long_ago)], 412),
        ("/one", &[("if-unmodified-since", &last_modified)], 200),
        ("/one", &[("if-unmodified-since", "not a date")], 200),
        ("/one", &[("if-match", "*"), ("if-unmodified-since", long_ago)], 200),
        ("/static/big.bin", &[("if-match", "\"nope\"")], 412),
        ("/static/big.bin", &[("if-unmodified-since", long_ago), ("range", "bytes=0-9")], 412),
    ];
    for (path, headers, want) in cases {
        let (parts, body) = get_with(&s.gw.url(path), headers).await;
        assert_eq!(parts.status.as_u16(), *want, "{path} {headers:?}");
        if *want == 412 {
            assert_eq!(&body[..], b"precondition failed\n");
        }
    }
    let head = Request::head(s.gw.url("/one")).header("if-match", "\"nope\"").body(full(Bytes::new())).unwrap();
    assert_eq!(send(head).await.0.status, 412);
    // The compressed form, before and after it is made.
    for _ in 0..5 {
        let gz = [("accept-encoding", "gzip")];
        let (parts, _) = get_with(&zipped.url("/z/long.txt"), &gz).await;
        assert_eq!(parts.status, 200);
        let coded = parts.headers["etag"].to_str().unwrap().to_owned();
        let (parts, _) = get_with(&zipped.url("/z/long.txt"), &[gz[0], ("if-match", "\"nope\"")]).await;
        assert_eq!(parts.status, 412, "compressed form {coded}");
        let (parts, _) =
            get_with(&zipped.url("/z/long.txt"), &[gz[0], ("if-match", "\"nope\""), ("if-none-match", &coded)]).await;
        assert_eq!(parts.status, 412, "held compressed form {coded}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A form never made (it would not be smaller): a client holding one it
    // names is still 412 when a precondition fails, not 304.
    let noise: Vec<u8> = (0..4000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x20).collect();
    std::fs::write(s.dir.path().join("root/noise.txt"), noise).unwrap();
    let (parts, _) = get(&zipped.url("/z/noise.txt")).await;
    let identity = parts.headers["etag"].to_str().unwrap().to_owned();
    let held = format!("{}-gzip\"", &identity[..identity.len() - 1]);
    let gz = ("accept-encoding", "gzip");
    for _ in 0..3 {
        let (parts, _) = get_with(&zipped.url("/z/noise.txt"), &[gz, ("if-none-match", &held)]).await;
        assert_eq!(parts.status, 304, "the client holds the form it names");
        let (parts, _) =
            get_with(&zipped.url("/z/noise.txt"), &[gz, ("if-none-match", &held), ("if-match", "\"nope\"")]).await;
        assert_eq!(parts.status, 412);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `If-Match` on a compressing route is compared with the tag of the
/// form it is answered with, by the strong comparison (RFC 9110 §13.1.1):
/// a request naming the identity tag gets the identity form, one naming a
/// kept form's tag that form, and the identity tag never passes for a
/// form encoded here (its tag is weak) nor for a held form's 304.
#[tokio::test]
async fn if_match_is_compared_with_the_form_answered() {
    let s = site().await;
    let root = s.dir.path().join("root");
    std::fs::write(root.join("long.txt"), "a line of text that compresses well\n".repeat(100)).unwrap();
    std::fs::write(root.join("huge.txt"), "a line of a file too large to keep\n".repeat(10_000)).unwrap();
    let noise: Vec<u8> = (0..4000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x20).collect();
    std::fs::write(root.join("noise.txt"), noise).unwrap();
    let toml = "[[routes]]\nname = \"z\"\nprefix = \"/z\"\ndir = \"root\"\ncompress = true\n";
    let zipped = TestGateway::start(config(toml, s.dir.path())).await;
    let gz = ("accept-encoding", "gzip");
    let tag = |parts: &http::response::Parts| parts.headers["etag"].to_str().unwrap().to_owned();
    let coding =
        |parts: &http::response::Parts| parts.headers.get("content-encoding").map(|v| v.to_str().unwrap().to_owned());
    // A kept file whose gzip form is never made (not smaller).
    let url = zipped.url("/z/noise.txt");
    let identity = tag(&get(&url).await.0);
    let held = format!("{}-gzip\"", &identity[..identity.len() - 1]);
    let (parts, _) = get_with(&url, &[gz, ("if-none-match", &held), ("if-match", &identity)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts)), (200, identity.clone()), "the identity form, asked for");
    let (parts, _) = get_with(&url, &[gz, ("if-none-match", &held), ("if-match", &held)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts)), (304, held.clone()), "the held form, named");
    // A kept file once its gzip form is made.
    let url = zipped.url("/z/long.txt");
    let identity = tag(&get(&url).await.0);
    let mut coded = None;
    for _ in 0..100 {
        let (parts, _) = get_with(&url, &[gz]).await;
        if coding(&parts).is_some() {
            coded = Some(tag(&parts));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let coded = coded.expect("the gzip form is made");
    let (parts, body) = get_with(&url, &[gz, ("if-match", &identity)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts), coding(&parts)), (200, identity.clone(), None));
    assert_eq!(body.len(), 3600);
    let (parts, _) = get_with(&url, &[gz, ("if-match", &coded)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts), coding(&parts)), (200, coded.clone(), Some("gzip".into())));
    let (parts, _) = get_with(&url, &[gz, ("if-match", &format!("W/{coded}"))]).await;
    assert_eq!(parts.status, 412);
    // A streamed file, compressed on the fly: its form's tag is weak, so
    // only the identity form can pass `If-Match`.
    let url = zipped.url("/z/huge.txt");
    let (parts, _) = get_with(&url, &[gz]).await;
    let weak = tag(&parts);
    assert_eq!(coding(&parts).as_deref(), Some("gzip"));
    let strong = weak.strip_prefix("W/").expect("a weak tag").to_owned();
    let (parts, body) = get_with(&url, &[gz, ("if-match", &strong)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts), coding(&parts)), (200, strong.clone(), None));
    assert_eq!(body.len(), 350_000);
    let (parts, _) = get_with(&url, &[gz, ("if-match", &weak)]).await;
    assert_eq!(parts.status, 412);
    let (parts, _) = get_with(&url, &[gz, ("if-match", &strong), ("if-none-match", &weak)]).await;
    assert_eq!((parts.status.as_u16(), tag(&parts)), (304, strong.clone()), "the 304 of the identity form");
}

/// A file replaced by rename, over and over, between two versions while it
/// is requested: every answer's validators, length and bytes are one
/// version's, kept (small) or streamed (large), and the kept one does not
/// stay stale once the swapping stops.
#[tokio::test]
async fn a_file_swapped_on_disk_is_answered_as_one_version() {
    let s = site().await;
    let root = s.dir.path().join("root");
    for (name, len) in [("small.bin", 1024usize), ("large.bin", 300 * 1024)] {
        let target = root.join(name);
        let mut versions = Vec::new();
        for (i, byte) in [b'A', b'B'].into_iter().enumerate() {
            let path = s.dir.path().join(format!("{name}.{i}"));
            // Two lengths for the large file, one for the small: a swap then
            // shows in the bytes alone.
            std::fs::write(&path, vec![byte; len + if len > 4096 { i * 4096 } else { 0 }]).unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000 + i as u64 * 1000);
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(t).unwrap();
            versions.push(path);
        }
        std::fs::hard_link(&versions[0], &target).unwrap();
        let url = s.gw.url(&format!("/static/{name}"));
        let etag_of = |byte: u8| {
            let (i, url) = (usize::from(byte == b'B'), url.clone());
            let (versions, target) = (versions.clone(), target.clone());
            async move {
                let tmp = target.with_extension("tmp");
                // A rename onto a link to the same file leaves it in place.
                let _ = std::fs::remove_file(&tmp);
                std::fs::hard_link(&versions[i], &tmp).unwrap();
                std::fs::rename(&tmp, &target).unwrap();
                get(&url).await.0.headers["etag"].clone()
            }
        };
        let tags = [(etag_of(b'A').await, b'A'), (etag_of(b'B').await, b'B')];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, versions, target) = (stop.clone(), versions.clone(), target.clone());
            std::thread::spawn(move || {
                let tmp = target.with_extension("swap");
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i ^= 1;
                    let _ = std::fs::remove_file(&tmp);
                    std::fs::hard_link(&versions[i], &tmp).unwrap();
                    std::fs::rename(&tmp, &target).unwrap();
                }
                // Left at version B.
                let _ = std::fs::remove_file(&tmp);
                std::fs::hard_link(&versions[1], &tmp).unwrap();
                std::fs::rename(&tmp, &target).unwrap();
            })
        };
        for _ in 0..300 {
            let (parts, body) = get(&url).await;
            assert_eq!(parts.status, 200);
            let byte = tags.iter().find(|(t, _)| same_version(t, &parts.headers["etag"])).map(|(_, b)| *b);
            let byte =
                byte.unwrap_or_else(|| panic!("{name}: an ETag of neither version: {:?}", parts.headers["etag"]));
            assert_eq!(parts.headers["content-length"], body.len().to_string().as_str(), "{name}");
            assert!(body.iter().all(|b| *b == byte), "{name}: bytes of the other version under {byte}'s ETag");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        let (parts, body) = get(&url).await;
        assert!(same_version(&parts.headers["etag"], &tags[1].0), "{name}: left at B");
        assert!(body.iter().all(|b| *b == b'B'), "{name}: B's ETag, B's bytes");
    }
}

/// Whether two `ETag`s name one version of a file: a kept file's tag is
/// its content's hash and length; a streamed file's is its modification
/// time, its change time and its length, and a hard link made to it (as the
/// swaps do) changes the change time.
fn same_version(a: &http::HeaderValue, b: &http::HeaderValue) -> bool {
    let ends = |t: &http::HeaderValue| {
        let t = t.to_str().unwrap().trim_matches('"').to_owned();
        let (first, last) = (t.split('-').next().unwrap().to_owned(), t.rsplit('-').next().unwrap().to_owned());
        (first, last)
    };
    ends(a) == ends(b)
}

/// A file dated before 1970 is served (an HTTP date cannot say its time:
/// 1970 is given), and one dated in the future gives no date past now.
#[tokio::test]
async fn files_with_dates_out_of_range_are_served() {
    let s = site().await;
    let root = s.dir.path().join("root");
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    for (name, t) in [
        ("old.txt", epoch - Duration::from_secs(10 * 365 * 86400)),
        ("new.txt", epoch + Duration::from_secs(4_102_444_800)),
    ] {
        std::fs::write(root.join(name), "dated\n").unwrap();
        std::fs::File::options().write(true).open(root.join(name)).unwrap().set_modified(t).unwrap();
        let (parts, body) = get(&s.gw.url(&format!("/static/{name}"))).await;
        assert_eq!(parts.status, 200, "{name}");
        assert_eq!(&body[..], b"dated\n");
        let shown = httpdate::parse_http_date(parts.headers["last-modified"].to_str().unwrap()).unwrap();
        assert!(shown >= epoch && shown <= std::time::SystemTime::now(), "{name}: {shown:?}");
        // Conditions compare with the date given.
        let lm = parts.headers["last-modified"].to_str().unwrap().to_owned();
        let (parts, _) = get_with(&s.gw.url(&format!("/static/{name}")), &[("if-modified-since", &lm)]).await;
        assert_eq!(parts.status, 304, "{name}");
    }
}

/// A file rewritten with its length and modification time kept, in place
/// (as `cp -p` onto it) or deleted and made again (which may reuse its
/// inode number, as a reproducible build's deploy does), is served anew
/// with another `ETag`, kept (small) or streamed (large). Before, the kept
/// bytes were served until a restart (only length, mtime and inode were
/// compared), and the tag (mtime and length) stayed: a client's
/// `If-Range` got the new bytes spliced onto the old.
#[tokio::test]
async fn a_file_rewritten_with_its_length_and_time_is_served_anew() {
    let s = site().await;
    let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    for (name, len) in [("deploy.txt", 16usize), ("deploy.bin", 300 * 1024)] {
        let path = s.dir.path().join("root").join(name);
        let url = s.gw.url(&format!("/static/{name}"));
        let mut tags = Vec::new();
        for (i, byte) in [b'A', b'B', b'C'].into_iter().enumerate() {
            if i == 2 {
                std::fs::remove_file(&path).unwrap();
            }
            // In place: truncated and written through the same inode.
            std::fs::write(&path, vec![byte; len]).unwrap();
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(t).unwrap();
            for again in [false, true] {
                let (parts, body) = get(&url).await;
                assert_eq!(parts.status, 200);
                assert!(body.len() == len && body.iter().all(|&b| b == byte), "{name} rewrite {i} (again: {again})");
                tags.push(parts.headers["etag"].clone());
            }
            // A client holding an older version's tag gets the whole file.
            if let Some(old) = tags.first().filter(|_| i > 0) {
                let (parts, _) = get_with(&url, &[("range", "bytes=0-3"), ("if-range", old.to_str().unwrap())]).await;
                assert_eq!(parts.status, 200, "{name} rewrite {i}: If-Range with the old tag");
            }
        }
        assert!(tags[0] == tags[1] && tags[2] == tags[3] && tags[4] == tags[5], "{name}: {tags:?}");
        assert!(tags[0] != tags[2] && tags[2] != tags[4] && tags[0] != tags[4], "{name}: {tags:?}");
    }
}

/// A symlink loop on a request's path is a 404, not the gateway's 500
/// (and an ERROR line a client could write at will).
#[tokio::test]
async fn a_symlink_loop_is_not_found() {
    let s = site().await;
    let root = s.dir.path().join("root");
    std::os::unix::fs::symlink(root.join("loop2"), root.join("loop1")).unwrap();
    std::os::unix::fs::symlink(root.join("loop1"), root.join("loop2")).unwrap();
    std::os::unix::fs::symlink(root.join("selfloop"), root.join("selfloop")).unwrap();
    for path in ["/static/loop1", "/static/loop1/x", "/static/selfloop", "/static/selfloop/index.html"] {
        let (parts, _) = get(&s.gw.url(path)).await;
        assert_eq!(parts.status, 404, "{path}");
    }
    assert_eq!(get(&s.gw.url("/static/hello.txt")).await.0.status, 200);
}

/// An HTTP/1.0 client that asked to keep its connection keeps it after a
/// streamed file (too large to keep), whole or a range of it, as after a
/// kept one: its length is known. Before, the streamed body said no
/// length and the connection closed after it.
#[tokio::test]
async fn an_http10_client_keeps_its_connection_after_a_streamed_file() {
    let s = site().await;
    for range in ["", "Range: bytes=0-9\r\n"] {
        let ask = |path: &str| format!("GET {path} HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n{range}\r\n");
        let both = ask("/static/big.bin") + &ask("/static/hello.txt");
        let r = raw(s.gw.addr, both.as_bytes(), Duration::from_secs(2)).await;
        let head = &r.text[..r.text.find("\r\n\r\n").unwrap()].to_ascii_lowercase();
        assert!(head.contains("connection: keep-alive"), "{range:?}: {head}");
        assert!(r.text.contains("hello, fil") && !r.closed, "{range:?}: the second request was not answered");
    }
}

/// A streamed file that shrinks while it is sent ends its HTTP/2 stream
/// with an error (a reset), not as a whole answer short of its
/// `content-length`. Before, the stream ended cleanly at the new end.
#[tokio::test]
async fn a_file_that_shrinks_mid_answer_fails_its_http2_stream() {
    use http_body_util::BodyExt;
    let s = site().await;
    let path = s.dir.path().join("root/shrinks.bin");
    std::fs::write(&path, vec![1u8; 20 << 20]).unwrap();
    let (mut sender, _conn) = h2_client(s.gw.addr).await;
    let req = Request::get(s.gw.url("/static/shrinks.bin")).body(full("")).unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.headers()["content-length"], "20971520");
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    std::fs::File::options().write(true).open(&path).unwrap().set_len(1 << 20).unwrap();
    let ended = bounded(async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        }
    })
    .await;
    // Reset by the gateway: a client that checks the length itself (as
    // the h2 crate does) would fail a stream ended short on its own.
    let e = ended.expect_err("the stream ended cleanly, short of its length");
    let h2 = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<h2::Error>());
    assert!(h2.is_some_and(|h2| h2.is_remote()), "the stream ended short, not reset by the gateway: {e:?}");
}
