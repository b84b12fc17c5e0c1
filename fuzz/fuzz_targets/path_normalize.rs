//! `path::normalize` on arbitrary paths: the result is a fixed point
//! (normalising it again changes nothing), starts with `/`, has no dot
//! segment (so it never climbs above the root), keeps every encoded slash
//! or backslash encoded, and (with merging) has no empty segment but a
//! trailing one. With `reject_encoded_slash`, nothing with `%2F`/`%5C` passes.
//! A path with a malformed escape is returned unchanged (screening refuses it).

#![no_main]

use gateway::path::{Options, normalize};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, bool, &[u8])| {
    let (merge_slashes, reject_encoded_slash, data) = input;
    let Ok(tail) = std::str::from_utf8(data) else {
        return;
    };
    let path = format!("/{tail}");
    let opts = Options { merge_slashes, reject_encoded_slash };
    let Ok(normal) = normalize(&path, opts) else {
        return;
    };
    if !gateway::limits::valid_percent_encoding(&path) {
        assert_eq!(normal, path, "a malformed path must be left for screening");
        return;
    }
    let again = normalize(&normal, opts).expect("a normal path normalises");
    assert_eq!(again, normal, "not idempotent: {path:?} -> {normal:?} -> {again:?}");
    assert!(normal.starts_with('/'), "{path:?} -> {normal:?}");
    let segments: Vec<&str> = normal[1..].split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        assert!(!matches!(*segment, "." | ".."), "{path:?} -> {normal:?} keeps a dot segment");
        if merge_slashes && i + 1 < segments.len() {
            assert!(!segment.is_empty(), "{path:?} -> {normal:?} keeps an empty segment");
        }
    }
    // An encoded slash or backslash is never decoded or created: the output
    // has as many of them as the input or fewer (segments removed), and the
    // same for raw backslashes.
    let encoded = |s: &str| {
        let lower = s.to_ascii_lowercase();
        lower.matches("%2f").count() + lower.matches("%5c").count()
    };
    if reject_encoded_slash {
        assert_eq!(encoded(&normal), 0, "{path:?} -> {normal:?} passed an encoded slash");
    }
    assert!(normal.matches('\\').count() <= path.matches('\\').count());
    assert!(encoded(&normal) <= encoded(&path), "{path:?} -> {normal:?}: encoded slashes appeared");
});
