//! The examples in the README, `docs/` and `deploy/` do what they say:
//! every TOML example passes `gateway check` (with the blanks a reader
//! fills in filled), and the examples that give figures give them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use toml::de::{DeTable, DeValue};

#[path = "common/process.rs"]
mod process;

use process::{Running, free_addr, http_get, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_gateway");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The ```toml blocks of a Markdown file.
fn toml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```toml") => current = Some(String::new()),
            Some(block) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The `gateway.toml: |` block of a Kubernetes ConfigMap, unindented.
fn configmap_toml(text: &str) -> String {
    let mut lines = text.lines().skip_while(|l| !l.trim_end().ends_with("gateway.toml: |")).skip(1);
    let first = lines.next().expect("a gateway.toml block");
    let indent = first.len() - first.trim_start().len();
    let mut out = format!("{}\n", &first[indent..]);
    for line in lines.take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent) {
        out.push_str(line.get(indent..).unwrap_or(""));
        out.push('\n');
    }
    out
}

/// Every TOML example, with where it is.
fn examples() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> =
        std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.sort();
    files.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, block) in toml_blocks(&text).into_iter().enumerate() {
            out.push((format!("{} block {}", file.strip_prefix(ROOT).unwrap().display(), i + 1), block));
        }
    }
    let configmap = std::fs::read_to_string(Path::new(ROOT).join("deploy/kubernetes/configmap.yaml")).unwrap();
    out.push(("deploy/kubernetes/configmap.yaml".to_owned(), configmap_toml(&configmap)));
    out
}

/// The blanks a reader fills in: the upstreams routes name but the
/// example leaves out, the files it names, the variables it reads.
fn filled(example: &str, dir: &Path) -> String {
    let doc = DeTable::parse(example).unwrap_or_else(|e| panic!("not TOML: {e}\n{example}"));
    let table = doc.get_ref();
    let defined: BTreeSet<String> = match table.get("upstreams").map(|v| v.get_ref()) {
        Some(DeValue::Table(t)) => t.keys().map(|k| k.get_ref().to_string()).collect(),
        _ => BTreeSet::new(),
    };
    let mut named = BTreeSet::new();
    if let Some(DeValue::Array(routes)) = table.get("routes").map(|v| v.get_ref()) {
        for route in routes {
            if let DeValue::Table(r) = route.get_ref()
                && let Some(DeValue::String(up)) = r.get("upstream").map(|v| v.get_ref())
            {
                named.insert(up.to_string());
            }
        }
    }
    let mut text = example.to_owned();
    for up in named.difference(&defined) {
        text.push_str(&format!("\n[upstreams.{up}]\nurl = \"http://127.0.0.1:9\"\n"));
    }
    let hash = bcrypt::hash("pw", 4).unwrap();
    std::fs::write(dir.join("users.htpasswd"), format!("ann:{hash}\n")).unwrap();
    std::fs::copy(Path::new(ROOT).join("tests/fixtures/jwt/jwks.json"), dir.join("jwks.json")).unwrap();
    text
}

#[test]
fn every_toml_example_passes_check() {
    let examples = examples();
    assert!(examples.len() >= 5, "{examples:?}");
    for (place, example) in examples {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, filled(&example, dir.path())).unwrap();
        let out = Command::new(BIN)
            .args(["check", "--config", path.to_str().unwrap()])
            .env_remove("GATEWAY_CONFIG")
            .env("REDIS_PASSWORD", "example")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{place}: {stderr}\n{example}");
    }
}

/// The value of the first sample of `metrics` whose line holds every one
/// of `parts`, or 0.
fn sample(metrics: &str, parts: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// `docs/protecting-the-upstream.md`'s queue example: six requests at once
/// on a route with `timeout = "1s"` to an upstream with `max_requests = 1`
/// that takes 300 ms: three 200s, then three 503s refused at once as
/// `queue_timeout` (a slot with less time left than the upstream takes is
/// not used), none sent to time out.
#[test]
fn the_queue_example_gives_its_figures() {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/protecting-the-upstream.md")).unwrap();
    let example = toml_blocks(&doc).into_iter().find(|b| b.starts_with("# q.toml")).expect("the q.toml example");
    let claim = "three 200s at 0.31,\n0.61 and 0.91 s, three 503s at 0.91 s, all three\n`reason=\"queue_timeout\"`, no `kind=\"timeout\"`";
    assert!(doc.contains(claim), "the figures this test checks are the doc's");

    let (gw, up) = (free_addr(), free_addr());
    let config = example.replace("127.0.0.1:28083", &gw).replace("127.0.0.1:28001", &up);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.toml");
    std::fs::write(&path, config).unwrap();
    let mut upstream = Command::new(BIN);
    upstream.args(["upstream", "--listen", &up, "--delay", "300ms"]).stderr(Stdio::null());
    let _upstream = Running(upstream.spawn().unwrap());
    let mut gateway = Command::new(BIN);
    gateway.args(["--config", path.to_str().unwrap()]).env_remove("GATEWAY_CONFIG").stderr(Stdio::null());
    let _gateway = Running(gateway.spawn().unwrap());
    wait_for(&up);
    wait_for(&gw);

    let answers: Vec<String> = std::thread::scope(|s| {
        let gw = &gw;
        let sent: Vec<_> = (1..=6).map(|i| s.spawn(move || http_get(gw, &format!("/q?{i}")))).collect();
        sent.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut statuses: Vec<&str> = answers.iter().map(|a| &a[9..12]).collect();
    statuses.sort();
    assert_eq!(statuses, ["200", "200", "200", "503", "503", "503"], "{answers:#?}");
    for refused in answers.iter().filter(|a| a.starts_with("HTTP/1.1 503")) {
        assert!(refused.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"), "{refused}");
    }
    let metrics = http_get(&gw, "/metrics");
    assert_eq!(sample(&metrics, &["gateway_rejected_total{", "reason=\"queue_timeout\""]), 3.0, "{metrics}");
    assert_eq!(sample(&metrics, &["gateway_upstream_errors_total{", "kind=\"timeout\""]), 0.0, "{metrics}");
}

/// The health `path` of every upstream in `example`.
fn health_paths(example: &str) -> Vec<String> {
    let doc = DeTable::parse(example).unwrap();
    let mut paths = Vec::new();
    if let Some(DeValue::Table(ups)) = doc.get_ref().get("upstreams").map(|v| v.get_ref()) {
        for up in ups.values() {
            if let DeValue::Table(up) = up.get_ref()
                && let Some(DeValue::Table(health)) = up.get("health").map(|v| v.get_ref())
                && let Some(DeValue::String(path)) = health.get("path").map(|v| v.get_ref())
            {
                paths.push(path.to_string());
            }
        }
    }
    paths
}

/// The ConfigMap's health checks, against `gateway upstream` as its app,
/// find it healthy (the gateway is ready and proxies), and every example's
/// health path is one the built-in upstream answers, but the gunicorn
/// app's, which answers every path.
#[test]
fn health_examples_work_against_the_built_in_upstream() {
    let (gw, up) = (free_addr(), free_addr());
    let mut upstream = Command::new(BIN);
    upstream.args(["upstream", "--listen", &up, "--delay", "10ms"]).stderr(Stdio::null());
    let _upstream = Running(upstream.spawn().unwrap());
    wait_for(&up);
    for (place, example) in examples().iter().filter(|(_, e)| !e.contains("127.0.0.1:28000")) {
        for path in health_paths(example) {
            let answer = http_get(&up, &path);
            assert!(answer.starts_with("HTTP/1.1 200"), "{place}: {path}: {answer}");
        }
    }

    let configmap = std::fs::read_to_string(Path::new(ROOT).join("deploy/kubernetes/configmap.yaml")).unwrap();
    let config = configmap_toml(&configmap)
        .replace("0.0.0.0:8080", &gw)
        .replace("http://127.0.0.1:8000", &format!("http://{up}"));
    assert!(config.contains(&gw) && config.contains(&up), "{config}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let mut gateway = Command::new(BIN);
    gateway.args(["--config", path.to_str().unwrap()]).env_remove("GATEWAY_CONFIG").stderr(Stdio::null());
    let _gateway = Running(gateway.spawn().unwrap());
    wait_for(&gw);
    // The first check runs at start-up; the next only after `interval`.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !http_get(&gw, "/readyz").starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "never ready: {}", http_get(&gw, "/readyz"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = http_get(&gw, "/a");
    assert!(a.starts_with("HTTP/1.1 200") && a.ends_with("ok"), "{a}");
}

fn retry_after(answer: &str) -> Option<&str> {
    answer.lines().find_map(|l| l.strip_prefix("retry-after: ").or_else(|| l.strip_prefix("Retry-After: ")))
}

/// A gateway running `config` (with `{gw}` and `{dead}`, an address
/// nothing listens on, filled in): its address and the process.
fn gateway_with(config: &str) -> (String, Running, tempfile::TempDir) {
    let (gw, dead) = (free_addr(), free_addr());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, config.replace("{gw}", &gw).replace("{dead}", &dead)).unwrap();
    let mut gateway = Command::new(BIN);
    gateway.args(["--config", path.to_str().unwrap()]).env_remove("GATEWAY_CONFIG").stderr(Stdio::null());
    let running = Running(gateway.spawn().unwrap());
    wait_for(&gw);
    (gw, running, dir)
}

/// `docs/protecting-the-upstream.md`'s `Retry-After` figures for an
/// upstream that is down: ejected by the default outlier settings, and
/// unhealthy by the default health checks.
#[test]
fn the_unavailable_examples_give_their_retry_after() {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/protecting-the-upstream.md")).unwrap();
    assert!(doc.contains("five 502s, then 503 with `Retry-After:\n30`"), "the doc's outlier figures");
    assert!(doc.contains("requests then got 503 with `Retry-After: 10`"), "the doc's health figures");
    let route = "[[routes]]\nname = 'app'\nprefix = '/'\nupstream = 'app'\n";

    let outlier = format!(
        "[server]\nlisten = \"{{gw}}\"\n[upstreams.app]\nurl = \"http://{{dead}}\"\n[upstreams.app.outlier]\n{route}"
    );
    let (gw, _gateway, _dir) = gateway_with(&outlier);
    let answers: Vec<String> = (0..6).map(|_| http_get(&gw, "/a")).collect();
    for answer in &answers[..5] {
        assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    }
    assert!(answers[5].starts_with("HTTP/1.1 503"), "{}", answers[5]);
    assert_eq!(retry_after(&answers[5]), Some("30"), "{}", answers[5]);

    let health = format!(
        "[server]\nlisten = \"{{gw}}\"\n[upstreams.app]\nurl = \"http://{{dead}}\"\n[upstreams.app.health]\npath = \"/healthz\"\n{route}"
    );
    let (gw, _gateway, _dir) = gateway_with(&health);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !http_get(&gw, "/readyz").starts_with("HTTP/1.1 503") {
        assert!(Instant::now() < deadline, "never unready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let answer = http_get(&gw, "/a");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(retry_after(&answer), Some("10"), "{answer}");
}

/// The one-line examples commented out in `config/gateway.toml`'s first
/// route (`# key = value`) each pass `gateway check` when uncommented
/// there, and none is an inline table over several lines (TOML 1.1, which
/// TOML 1.0 tools refuse).
#[test]
fn the_commented_route_examples_work_uncommented() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("config/gateway.toml")).unwrap();
    let (head, rest) = text.split_once("[[routes]]\n").unwrap();
    let (first_route, others) = rest.split_once("\n[[routes]]\n").unwrap();
    let mut tried = 0;
    for line in first_route.lines() {
        let Some(example) = line.strip_prefix("# ") else { continue };
        let Some((key, value)) = example.split_once(" = ") else { continue };
        if key.contains(' ') || key.starts_with('-') {
            continue;
        }
        // An example's trailing comment is the reader's, not TOML's.
        let value = value.split("   #").next().unwrap().trim();
        assert!(!value.ends_with('{'), "an inline table over several lines: {line}");
        if key == "auth" || key.starts_with("forward") {
            continue; // named files and services of the reader's own (docs/access.md's examples are checked)
        }
        let route = first_route.replace(line, &format!("{key} = {value}"));
        let config = format!("{head}[[routes]]\n{route}\n[[routes]]\n{others}");
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [("public/demo.txt", "demo\n"), ("public/index.html", "<p>\n")] {
            std::fs::create_dir_all(dir.path().join("public")).unwrap();
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).unwrap();
        let out = Command::new(BIN).args(["check", "--config", path.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
        tried += 1;
    }
    assert!(tried >= 10, "{tried} examples");
}
