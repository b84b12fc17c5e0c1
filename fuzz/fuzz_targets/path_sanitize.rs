//! `files::sanitize` on arbitrary text: whatever it accepts is a relative path
//! of plain segments, one per non-empty raw segment, that cannot leave the
//! directory it is joined to.

#![no_main]

use std::path::{Component, Path, PathBuf};

use gateway::files::sanitize;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(rest) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(relative) = sanitize(rest) else {
        return;
    };
    assert!(relative.is_relative(), "{rest:?} -> {relative:?} is not relative");

    let mut count = 0;
    for component in relative.components() {
        let Component::Normal(segment) = component else {
            panic!("{rest:?} -> {relative:?} has a non-normal component {component:?}");
        };
        let segment = segment.to_str().expect("sanitize returns UTF-8 segments");
        assert!(
            !segment.contains(['/', '\\', '\0']),
            "{rest:?} -> {relative:?} has a forbidden byte in segment {segment:?}"
        );
        count += 1;
    }
    // Each raw segment is decoded on its own: none may vanish or split, which
    // would happen to "." or to a decoded '/'.
    let raw_segments = rest.split('/').filter(|s| !s.is_empty()).count();
    assert_eq!(count, raw_segments, "{rest:?} -> {relative:?}: segment count changed");

    let root = Path::new("/srv/fuzz-root");
    let joined = lexical_normalize(&root.join(&relative));
    assert!(joined.starts_with(root), "{rest:?} -> {relative:?} escapes {root:?} as {joined:?}");
});

/// Resolves `.` and `..` without touching the file system, as an attacker's
/// path would be resolved by the kernel if every segment were a directory.
fn lexical_normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
