//! A `dir` route's remaining path made a relative path, pure and table-tested.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::GatewayError;

/// Validates a `dir` route's remaining path (after the prefix) into a
/// relative path with only normal segments.
///
/// Each raw segment is percent-decoded on its own, so an encoded slash
/// (`%2f`) can never create a new segment; dot segments, backslashes, NUL and
/// malformed percent-encoding are refused (400). Empty segments are skipped.
/// A name on Linux is bytes, not text: decoded bytes that are not UTF-8
/// (`%E9.txt`) name the file of those bytes, as nginx has it.
pub fn sanitize(rest: &str) -> Result<PathBuf, GatewayError> {
    let mut out = PathBuf::new();
    for raw in rest.split('/').filter(|s| !s.is_empty()) {
        if !crate::limits::valid_percent_encoding(raw) {
            return Err(GatewayError::BadPath("malformed percent-encoding"));
        }
        let decoded: Cow<[u8]> = percent_encoding::percent_decode_str(raw).into();
        if decoded.contains(&b'/') {
            return Err(GatewayError::BadPath("encoded slash"));
        }
        if decoded.contains(&b'\\') {
            return Err(GatewayError::BadPath("backslash"));
        }
        if decoded.contains(&0) {
            return Err(GatewayError::BadPath("NUL byte"));
        }
        if *decoded == *b".." || *decoded == *b"." {
            return Err(GatewayError::BadPath("dot segment"));
        }
        out.push(OsStr::from_bytes(&decoded));
    }
    Ok(out)
}

/// A path under a `dir` root that names a hidden file or directory: one
/// whose name starts with a dot (`.git/config`, `.env`, `.htpasswd`), which
/// a tree of files often holds and seldom means to publish. `.well-known`
/// (RFC 8615: `security.txt`, ACME challenges) is not hidden.
pub(super) fn hidden(relative: &Path) -> bool {
    relative.components().any(|c| {
        let name = c.as_os_str().as_encoded_bytes();
        name.starts_with(b".") && name != b".well-known"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_table() {
        let cases = [
            ("", false),
            ("a/b.txt", false),
            ("index.html", false),
            (".env", true),
            (".git/config", true),
            ("a/.htpasswd", true),
            ("a/.b/c", true),
            ("..a", true),
            ("a.b/c.", false),
            (".well-known/security.txt", false),
            (".well-known/.x", true),
            (".well-knownx", true),
        ];
        for (path, want) in cases {
            assert_eq!(hidden(Path::new(path)), want, "{path}");
        }
    }

    #[test]
    fn sanitize_table() {
        let ok: &[(&str, &str)] = &[
            ("", ""),
            ("/", ""),
            ("/a/b.txt", "a/b.txt"),
            ("//a///b", "a/b"),
            ("/sp%20ace.txt", "sp ace.txt"),
            ("/%252e%252e/x", "%2e%2e/x"),
            ("/..a/b..", "..a/b.."),
        ];
        for (input, want) in ok {
            assert_eq!(sanitize(input).unwrap(), PathBuf::from(want), "{input}");
        }
        let bad = [
            "/../etc/passwd",
            "/a/../../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/.%2e/x",
            "/a%2fb",
            "/..%2f..%2fetc",
            "/a%5cb",
            "/a\\b",
            "/a%00b",
            "/./a",
            "/%zz",
            "/%2",
            "/a%",
            "/%e9%2f..",
            "/%e9%5c..",
            "/%e9%00",
        ];
        for input in bad {
            assert!(matches!(sanitize(input), Err(GatewayError::BadPath(_))), "{input} should be refused");
        }
        // A name on Linux is bytes: one that is not UTF-8 is that name.
        let bytes: &[(&str, &[u8])] = &[
            ("/%e9.txt", b"\xe9.txt"),
            ("/%ff%fe", b"\xff\xfe"),
            ("/a/%E9/b%E8", b"a/\xe9/b\xe8"),
            ("/%c0%ae%c0%ae/x", b"\xc0\xae\xc0\xae/x"),
            ("/%C3%A9", "\u{e9}".as_bytes()),
        ];
        for (input, want) in bytes {
            let got = sanitize(input).unwrap();
            assert_eq!(got.as_os_str().as_encoded_bytes(), *want, "{input}");
        }
    }
}
