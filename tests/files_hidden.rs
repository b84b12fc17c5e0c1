//! A `dir` route hides names that start with a dot (`.git`, `.env`),
//! unless it sets `dotfiles = true`; `.well-known` is always served.

mod common;

use common::*;

/// A root with a `.git` directory, a `.env`, a `.well-known` file, a
/// hidden directory with an index, and a plain name linking into `.git`.
fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for sub in [".git", ".well-known", ".hidden", "pub", "conf"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::write(root.join(".git/config"), "[remote] url = secret").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=secret").unwrap();
    std::fs::write(root.join(".well-known/security.txt"), "Contact: ops").unwrap();
    std::fs::write(root.join(".hidden/index.html"), "secret index").unwrap();
    std::fs::write(root.join("pub/a.txt"), "public").unwrap();
    std::fs::write(root.join("conf/prod.env"), "DB_PASSWORD=secret").unwrap();
    std::os::unix::fs::symlink(root.join(".git/config"), root.join("pub/link.txt")).unwrap();
    // Dot names that link to plain ones: a file and a directory.
    std::os::unix::fs::symlink(root.join("conf/prod.env"), root.join(".env.production")).unwrap();
    std::os::unix::fs::symlink(root.join("conf"), root.join(".conf")).unwrap();
    dir
}

#[tokio::test]
async fn names_that_start_with_a_dot_are_served_only_when_the_route_says_so() {
    let dir = tree();
    let toml = r#"
[[routes]]
name = "static"
prefix = "/static"
dir = "root"

[[routes]]
name = "open"
prefix = "/open"
dir = "root"
dotfiles = true
"#;
    let gw = TestGateway::start(config(toml, dir.path())).await;
    // (path, served by default, body)
    let cases = [
        ("/pub/a.txt", true, "public"),
        ("/.well-known/security.txt", true, "Contact: ops"),
        ("/.env", false, "TOKEN=secret"),
        ("/%2eenv", false, "TOKEN=secret"),
        ("/.git/config", false, "[remote] url = secret"),
        ("/pub/link.txt", false, "[remote] url = secret"),
        ("/.hidden/", false, "secret index"),
        ("/pub/../.env", false, "TOKEN=secret"),
        ("/.env.production", false, "DB_PASSWORD=secret"),
        ("/.conf/prod.env", false, "DB_PASSWORD=secret"),
        ("/conf/prod.env", true, "DB_PASSWORD=secret"),
    ];
    for (path, served, body) in cases {
        let (parts, got) = get(&gw.url(&format!("/static{path}"))).await;
        let want = if served { 200 } else { 404 };
        assert_eq!(parts.status, want, "/static{path}: {}", String::from_utf8_lossy(&got));
        assert_eq!(got == body.as_bytes(), served, "/static{path}");
        let (parts, got) = get(&gw.url(&format!("/open{path}"))).await;
        assert_eq!(parts.status, 200, "/open{path}");
        assert_eq!(got, body.as_bytes(), "/open{path}");
    }
    // A hidden directory without its slash: a 404 like a missing one, not
    // the redirect to its slash form that would tell it exists.
    for (path, open) in [("/.git", 301), ("/.hidden", 301), ("/.missing", 404)] {
        assert_eq!(get(&gw.url(&format!("/static{path}"))).await.0.status, 404, "/static{path}");
        assert_eq!(get(&gw.url(&format!("/open{path}"))).await.0.status, open, "/open{path}");
    }
}
