//! Request path normalisation before routing (RFC 3986 §6.2.2): pure,
//! table-tested and fuzzed.
//!
//! A route's policy must hold whatever spelling a client uses for a path, and
//! the upstream must see the same path the route was chosen on; otherwise
//! `/api//admin`, `/api/./admin`, `/api/x/../admin` or `/api/%61dmin` slip
//! past a route for `/api/admin`, and `/b/../secret` escapes a rewrite once
//! the upstream normalises it. So, in one pass over the path:
//!
//! - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!   decoded and every other escape is written with upper-case hex (§6.2.2.1,
//!   §6.2.2.2);
//! - an encoded `/` or `\` (`%2F`, `%5C`) is never decoded, so it can never
//!   create a path segment (or it is refused, with `reject_encoded_slash`);
//!   a raw `\` is refused: WHATWG URL parsers (Node, Deno, Bun, undici) read
//!   it as `/`, so `/api/x/..\admin` would be `/api/admin` upstream;
//! - dot segments are removed (§5.2.4), after decoding, so `%2e%2e` is `..`;
//!   a path that climbs above `/` is refused rather than clamped;
//! - repeated slashes are merged (`merge_slashes`), as nginx does.
//!
//! A path with a `%` not followed by two hex digits is left as it is:
//! request screening refuses it with 400 once the route is known. (Decoding
//! around such a `%` could create a new escape, `%%32%66` becoming `%2f`.)
//! Hand-written: no crate does
//! RFC 3986 normalisation on a path without also parsing it as a URL (which
//! would change what an origin-form target means).

use std::borrow::Cow;

/// How to normalise.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Merge runs of `/` into one.
    pub merge_slashes: bool,
    /// Refuse `%2F` and `%5C` instead of keeping them encoded.
    pub reject_encoded_slash: bool,
}

/// Why a path cannot be normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// More `..` segments than there are segments to remove.
    #[error("path climbs above the root")]
    AboveRoot,
    /// An encoded `/` or `\`, with `reject_encoded_slash` on.
    #[error("encoded slash or backslash")]
    EncodedSlash,
    /// A raw `\`.
    #[error("backslash")]
    Backslash,
    /// A dot segment with a parameter (`..;x`, `.;`): servers that strip
    /// `;` parameters (Tomcat, Jetty) treat it as `..`, so the gateway would
    /// route on one path and the upstream serve another.
    #[error("dot segment with a parameter")]
    DotSegmentParam,
    /// A dot segment an encoded slash or a `;` parameter makes
    /// (`/a%2F..%2Fb`), for an upstream that splits there (see
    /// [`routing_view`]).
    #[error("dot segment between encoded slashes")]
    EncodedDotSegment,
}

impl PathError {
    /// What is wrong, for the 400's log line.
    pub fn reason(self) -> &'static str {
        match self {
            PathError::AboveRoot => "path climbs above the root",
            PathError::EncodedSlash => "encoded slash or backslash",
            PathError::Backslash => "backslash in path",
            PathError::DotSegmentParam => "dot segment with a parameter (..;)",
            PathError::EncodedDotSegment => "dot segment between encoded slashes or parameters",
        }
    }
}

/// The normalised form of `path`; borrowed when it is already normal (the
/// common case, checked in one scan without allocating).
pub fn normalize(path: &str, opts: Options) -> Result<Cow<'_, str>, PathError> {
    // Only origin-form paths are normalised; `*` (OPTIONS) is left alone.
    if !path.starts_with('/') || is_normal(path.as_bytes(), opts.merge_slashes) {
        return Ok(Cow::Borrowed(path));
    }
    if path.contains('\\') {
        return Err(PathError::Backslash);
    }
    if !crate::limits::valid_percent_encoding(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path, opts.reject_encoded_slash)?;
    Ok(Cow::Owned(remove_dot_segments(&decoded, opts.merge_slashes)?))
}

/// Whether `path` has no escape, no backslash, no dot segment and (when
/// merging) no `//`.
fn is_normal(p: &[u8], merge_slashes: bool) -> bool {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'%' | b'\\' => return false,
            b'/' => match p.get(i + 1) {
                Some(b'/') if merge_slashes => return false,
                Some(b'.') => {
                    let rest = &p[i + 2..];
                    let dots = if rest.first() == Some(&b'.') { &rest[1..] } else { rest };
                    if dots.is_empty() || dots[0] == b'/' || dots[0] == b';' {
                        return false;
                    }
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    true
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes escapes of unreserved characters and upper-cases the others.
fn decode_unreserved(path: &str, reject_encoded_slash: bool) -> Result<String, PathError> {
    let p = path.as_bytes();
    let mut out = String::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        let escape = (p[i] == b'%').then(|| Some((hex_value(*p.get(i + 1)?)?, hex_value(*p.get(i + 2)?)?))).flatten();
        let Some((hi, lo)) = escape else {
            // Anything but an escape is copied; the path came from a &str
            // and only ASCII is ever decoded, so `out` stays UTF-8.
            let ch_len = path[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&path[i..i + ch_len]);
            i += ch_len;
            continue;
        };
        let byte = hi << 4 | lo;
        if reject_encoded_slash && matches!(byte, b'/' | b'\\') {
            return Err(PathError::EncodedSlash);
        }
        if is_unreserved(byte) {
            out.push(byte as char);
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[hi as usize]));
            out.push(char::from(b"0123456789ABCDEF"[lo as usize]));
        }
        i += 3;
    }
    Ok(out)
}

/// RFC 3986 §5.2.4 on an absolute path, refusing to climb above `/`, and
/// merging empty segments when asked.
fn remove_dot_segments(path: &str, merge_slashes: bool) -> Result<String, PathError> {
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    let mut trailing_slash = false;
    for (i, segment) in segments.into_iter().enumerate() {
        trailing_slash = false;
        match segment {
            "." => trailing_slash = true,
            s if s.starts_with(".;") || s.starts_with("..;") => return Err(PathError::DotSegmentParam),
            ".." => {
                out.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = true;
            }
            "" if i == last || merge_slashes => trailing_slash = i == last,
            s => out.push(s),
        }
    }
    let mut normal = String::with_capacity(path.len());
    for s in &out {
        normal.push('/');
        normal.push_str(s);
    }
    if trailing_slash || normal.is_empty() {
        normal.push('/');
    }
    Ok(normal)
}

/// The path as an upstream that splits segments at an encoded slash
/// (`%2F`, as Werkzeug and many WSGI servers decode it) or drops a
/// segment's `;` parameters (Tomcat, Jetty) reads it, for choosing a
/// route: otherwise `/admin%2Fsecret` and `/admin;x/secret` chose an open
/// `/` route over a guarded `/admin` and reached the same handler. `None`
/// for a path with neither (the common case, one scan); refused when such
/// a split makes a dot segment (`/a%2F..%2Fb`). Empty segments are left
/// out. Takes a normalised path (escapes in upper case).
pub fn routing_view(path: &str) -> Option<Result<String, PathError>> {
    if !path.bytes().any(|b| b == b';' || b == b'%') || !(path.contains(';') || path.contains("%2F")) {
        // (One scan for either byte first: most paths hold neither.)
        return None;
    }
    let mut view = String::with_capacity(path.len());
    for piece in path.split('/').flat_map(|segment| segment.split("%2F")) {
        let name = piece.split(';').next().unwrap_or("");
        match name {
            "" => continue,
            "." | ".." => return Some(Err(PathError::EncodedDotSegment)),
            _ => {
                view.push('/');
                view.push_str(name);
            }
        }
    }
    if view.is_empty() || path.ends_with('/') {
        view.push('/');
    }
    Some(Ok(view))
}

/// Whether a request's `path` begins with the route `prefix` it was routed
/// to by its [`routing_view`], as a whole segment, a segment with
/// parameters or one an encoded slash ends: the part of it after the
/// prefix is then what a rewrite or a file route takes.
pub fn carries(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || path.strip_prefix(prefix).is_some_and(|rest| {
            rest.is_empty() || rest.starts_with('/') || rest.starts_with(';') || rest.starts_with("%2F")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MERGE: Options = Options { merge_slashes: true, reject_encoded_slash: false };
    const KEEP: Options = Options { merge_slashes: false, reject_encoded_slash: false };
    const REJECT: Options = Options { merge_slashes: true, reject_encoded_slash: true };

    #[test]
    fn normalize_table() {
        let cases: &[(&str, Options, Result<&str, PathError>)] = &[
            ("/", MERGE, Ok("/")),
            ("/a/b", MERGE, Ok("/a/b")),
            ("/a/b/", MERGE, Ok("/a/b/")),
            ("/.well-known/x", MERGE, Ok("/.well-known/x")),
            ("/a/..b/c..", MERGE, Ok("/a/..b/c..")),
            ("/api//admin", MERGE, Ok("/api/admin")),
            ("//api///admin//", MERGE, Ok("/api/admin/")),
            ("/api/./admin", MERGE, Ok("/api/admin")),
            ("/api/x/../admin", MERGE, Ok("/api/admin")),
            ("/api/%61dmin", MERGE, Ok("/api/admin")),
            ("/api/%2e/admin", MERGE, Ok("/api/admin")),
            ("/api/x/%2E%2e/admin", MERGE, Ok("/api/admin")),
            ("/a/.", MERGE, Ok("/a/")),
            ("/a/b/..", MERGE, Ok("/a/")),
            ("/a/b/../..", MERGE, Ok("/")),
            ("/.", MERGE, Ok("/")),
            ("/%7euser/%41%42%2d%5f", MERGE, Ok("/~user/AB-_")),
            ("/a%2fb", MERGE, Ok("/a%2Fb")),
            ("/a%2F..%2Fb", MERGE, Ok("/a%2F..%2Fb")),
            ("/%2e%2e%2fetc", MERGE, Ok("/..%2Fetc")),
            ("/a%5cb", MERGE, Ok("/a%5Cb")),
            ("/public/..;/admin", MERGE, Err(PathError::DotSegmentParam)),
            ("/public/.;x/admin", MERGE, Err(PathError::DotSegmentParam)),
            ("/public/%2e%2e;/admin", MERGE, Err(PathError::DotSegmentParam)),
            ("/a/..;", MERGE, Err(PathError::DotSegmentParam)),
            ("/a;b/c", MERGE, Ok("/a;b/c")),
            ("/a/...;/b", MERGE, Ok("/a/...;/b")),
            ("/sp%20ace", MERGE, Ok("/sp%20ace")),
            ("/%e2%82%ac", MERGE, Ok("/%E2%82%AC")),
            ("/%25", MERGE, Ok("/%25")),
            ("/%2561", MERGE, Ok("/%2561")),
            // Malformed escapes: left alone for screening to refuse.
            ("/a%zz/./b", MERGE, Ok("/a%zz/./b")),
            ("/a%", MERGE, Ok("/a%")),
            ("/x/../a%4", MERGE, Ok("/x/../a%4")),
            ("/%%32%66", MERGE, Ok("/%%32%66")),
            ("/é/./x", MERGE, Ok("/é/x")),
            ("*", MERGE, Ok("*")),
            ("/a//b", KEEP, Ok("/a//b")),
            ("//a", KEEP, Ok("//a")),
            ("/a//../b", KEEP, Ok("/a/b")),
            ("/a//", KEEP, Ok("/a//")),
            ("/a/./b//c/", KEEP, Ok("/a/b//c/")),
            ("/..", MERGE, Err(PathError::AboveRoot)),
            ("/../a", MERGE, Err(PathError::AboveRoot)),
            ("/a/../../b", MERGE, Err(PathError::AboveRoot)),
            ("/%2e%2e/x", MERGE, Err(PathError::AboveRoot)),
            ("//..", MERGE, Err(PathError::AboveRoot)),
            ("/a%2Fb", REJECT, Err(PathError::EncodedSlash)),
            ("/a%5c", REJECT, Err(PathError::EncodedSlash)),
            ("/a%2eb", REJECT, Ok("/a.b")),
            ("/api/x/..\\admin", MERGE, Err(PathError::Backslash)),
            ("/a\\b", KEEP, Err(PathError::Backslash)),
            ("/a%zz\\b", MERGE, Err(PathError::Backslash)),
        ];
        for (input, opts, want) in cases {
            let got = normalize(input, *opts);
            assert_eq!(got.as_deref().map_err(|e| *e), *want, "{input} {opts:?}");
            if let Ok(normal) = got {
                assert_eq!(normalize(&normal, *opts).as_deref(), Ok(normal.as_ref()), "idempotent: {input}");
            }
        }
    }

    #[test]
    fn already_normal_paths_are_borrowed() {
        for p in ["/", "/a/b/c", "/static/app.js", "/a/.hidden", "/a-b_c~d/e.f"] {
            assert!(matches!(normalize(p, MERGE), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn routing_view_table() {
        let cases: &[(&str, Option<Result<&str, PathError>>)] = &[
            ("/admin/secret", None),
            ("/a%20b", None),
            ("/admin%2Fsecret", Some(Ok("/admin/secret"))),
            ("/admin;x/secret", Some(Ok("/admin/secret"))),
            ("/admin;x", Some(Ok("/admin"))),
            ("/admin;x/", Some(Ok("/admin/"))),
            ("/;x/admin", Some(Ok("/admin"))),
            ("/%2Fadmin", Some(Ok("/admin"))),
            ("/a%2F%2Fb;c=d;e/f", Some(Ok("/a/b/f"))),
            ("/;", Some(Ok("/"))),
            ("/a%2F..%2Fb", Some(Err(PathError::EncodedDotSegment))),
            ("/..%2Fetc", Some(Err(PathError::EncodedDotSegment))),
            ("/a/.%2Fb", Some(Err(PathError::EncodedDotSegment))),
        ];
        for (path, want) in cases {
            let got = routing_view(path);
            assert_eq!(got.as_ref().map(|r| r.as_deref().map_err(|e| *e)), *want, "{path}");
        }
    }

    #[test]
    fn carries_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("/admin;x/secret", "/admin", true),
            ("/admin%2Fsecret", "/admin", true),
            ("/admin", "/admin", true),
            ("/admin/", "/admin/", true),
            ("/anything;x", "/", true),
            ("/admin%2Fpanel%2Fx", "/admin/panel", false),
            ("/admin;x/panel", "/admin/panel", false),
            ("/administrator;x", "/admin", false),
        ];
        for (path, prefix, want) in cases {
            assert_eq!(carries(path, prefix), *want, "{path} {prefix}");
        }
    }
}
