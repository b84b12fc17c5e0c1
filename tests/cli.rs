//! The binary's command line: `check`, bad configs refused with status 64
//! before anything binds, and the built-in upstream.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/process.rs"]
mod process;

use process::{Running, free_addr, http_get, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_gateway");

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn check_prints_resolved_routes() {
    let out = Command::new(BIN).args(["check", "--config", "config/gateway.toml"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("config/gateway.toml: ok"), "{stdout}");
    assert!(stdout.contains("proxy -> service_a (http://127.0.0.1:8000) rewrite /a timeout 2s"), "{stdout}");
    assert!(stdout.contains("file "), "{stdout}");
}

#[test]
fn bad_configs_exit_64_with_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    // A port held by this test throughout: a refused config is refused
    // before the gateway tries to listen, so none says it cannot.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let head = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n[upstreams.a]\nurl = \"http://127.0.0.1:9\"\n");
    let cases = [
        ("[[routes]]\nname='r'\nprefix='/r'\nupstream='ghost'\n", "routes[0].upstream", "unknown upstream \"ghost\""),
        ("[[routes]]\nname='r'\nprefix='/r'\n", "routes[0].upstream", "has no target"),
        (
            "[[routes]]\nname='r'\nprefix='/r'\nupstream='a'\nfile='gateway.toml'\n",
            "routes[0].file",
            "sets upstream and file",
        ),
        (
            "[[routes]]\nname='r'\nprefix='/r'\nupstream='a'\ntimeout='fast'\n",
            "routes[0].timeout",
            "invalid duration \"fast\"",
        ),
        (
            "[[routes]]\nname='r'\nprefix='/r'\nupstream='a'\n[[routes]]\nname='r'\nprefix='/s'\nupstream='a'\n",
            "routes[1].name",
            "duplicate route name \"r\"",
        ),
        ("[upstreams.b]\nurl='http//broken'\n", "upstreams.b.url", "invalid URL"),
        ("[[routes]]\nname='r'\nprefix='/r'\ndir='no-such-root'\n", "routes[0].dir", "is not a directory"),
    ];
    for (body, key, reason) in cases {
        let path = write_config(dir.path(), &format!("{head}{body}"));
        for args in [vec!["--config", path.to_str().unwrap()], vec!["check", "--config", path.to_str().unwrap()]] {
            let out = Command::new(BIN).args(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{args:?} {body}: {stderr}");
            assert!(stderr.contains(path.to_str().unwrap()), "names the file: {stderr}");
            assert!(stderr.contains(key), "names the key {key}: {stderr}");
            assert!(stderr.contains(reason), "says {reason}: {stderr}");
            assert!(!stderr.contains("cannot listen"), "tried to listen: {stderr}");
        }
    }
    drop(held);

    let out = Command::new(BIN).args(["--config", "/no/such/gateway.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/gateway.toml"));
}

#[test]
fn environment_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[server]\nlisten = \"127.0.0.1:1\"\n");
    let out = Command::new(BIN)
        .args(["check", "--config", path.to_str().unwrap()])
        .env("GATEWAY__SERVER__LISTEN", "127.0.0.1:4321")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("listen 127.0.0.1:4321"));
    let out = Command::new(BIN)
        .args(["check", "--config", path.to_str().unwrap()])
        .env("GATEWAY__SERVER__SHUTDOWN_TIMEOUT", "whenever")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.shutdown_timeout"));
}

#[test]
fn built_in_upstream_and_sigterm_exit_zero() {
    let up_addr = free_addr();
    let mut upstream = Command::new(BIN)
        .args(["upstream", "--listen", &up_addr, "--delay", "300ms"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&up_addr);
    let started = Instant::now();
    let a = http_get(&up_addr, "/a");
    assert!(a.starts_with("HTTP/1.1 200") && a.ends_with("ok"), "{a}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(http_get(&up_addr, "/hello").starts_with("HTTP/1.1 200"));

    // The gateway binary in front of it, stopped with SIGTERM.
    let dir = tempfile::tempdir().unwrap();
    let gw_addr = free_addr();
    let path = write_config(
        dir.path(),
        &format!(
            "[server]\nlisten = \"{gw_addr}\"\n[upstreams.a]\nurl = \"http://{up_addr}\"\n[[routes]]\nname='b'\nprefix='/b'\nupstream='a'\nrewrite='/a'\n"
        ),
    );
    let mut gw = Command::new(BIN).args(["--config", path.to_str().unwrap()]).stderr(Stdio::null()).spawn().unwrap();
    wait_for(&gw_addr);
    let b = http_get(&gw_addr, "/b");
    assert!(b.starts_with("HTTP/1.1 200") && b.ends_with("ok"), "{b}");

    for child in [&mut gw, &mut upstream] {
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0));
    }
}

/// The binary copied to an empty folder, run there with no arguments,
/// serves the embedded default's files: they travel inside it, not as paths
/// into the folder it was built in. Its demo folder goes when it exits.
#[test]
fn the_binary_runs_the_embedded_default_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("gateway");
    std::fs::copy(BIN, &bin).unwrap();
    let gw_addr = free_addr();
    let demo_url = format!("http://{}", free_addr());
    let mut gw = Command::new(&bin)
        .current_dir(dir.path())
        .env_remove("GATEWAY_CONFIG")
        .env("GATEWAY__SERVER__LISTEN", &gw_addr)
        .env("GATEWAY__UPSTREAMS__SERVICE_A__URL", &demo_url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It needs the demo upstream's port too: say so if it could not start.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&gw_addr).is_err() {
        if let Some(status) = gw.try_wait().unwrap() {
            let mut stderr = String::new();
            gw.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            panic!("the gateway exited ({status}) before listening: {stderr}");
        }
        assert!(Instant::now() < deadline, "{gw_addr} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let file = http_get(&gw_addr, "/file");
    let demo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/public/demo.txt")).unwrap();
    assert!(file.starts_with("HTTP/1.1 200") && file.ends_with(&demo), "{file}");
    let index = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/public/index.html")).unwrap();
    let page = http_get(&gw_addr, "/static/");
    assert!(page.starts_with("HTTP/1.1 200") && page.ends_with(&index), "{page}");

    Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
    let status = gw.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let mut stdout = String::new();
    gw.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let demo_dir = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("demo files (carried in the binary): "))
        .unwrap_or_else(|| panic!("the start-up lines name the demo folder: {stdout}"));
    assert!(!demo_dir.starts_with(env!("CARGO_MANIFEST_DIR")), "served from the source tree: {demo_dir}");
    assert!(!Path::new(demo_dir).exists(), "{demo_dir} is left behind");
}

/// What the gateway writes to stderr while it answers `GET /al/logged`,
/// with `server` keys added to an access-logged config and `RUST_LOG` set.
fn access_logged(server: &str, rust_log: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let path = write_config(
        dir.path(),
        &format!(
            "[server]\nlisten = \"{addr}\"\naccess_log = true\n{server}\n[[routes]]\nname = 'al'\nprefix = '/al'\nrespond = {{ status = 200 }}\n"
        ),
    );
    let mut gw = Command::new(BIN)
        .args(["--config", path.to_str().unwrap()])
        .env("RUST_LOG", rust_log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it is written: the line is written once the answer's body is
    // done with, which may come a moment after the client has the answer,
    // so the gateway is stopped only once it is there (or 10 s went by).
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut pipe = gw.stderr.take().unwrap();
    let sink = stderr.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    wait_for(&addr);
    assert!(http_get(&addr, "/al/logged").starts_with("HTTP/1.1 200"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stderr.lock().unwrap().contains("/al/logged") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
    assert_eq!(gw.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
    stderr.lock().unwrap().clone()
}

/// The access log is switched by `server.access_log`, not by the log
/// level: under `RUST_LOG=warn` its lines are still written.
#[test]
fn the_access_log_follows_its_key_not_the_log_level() {
    let stderr = access_logged("", "warn");
    assert!(stderr.contains("/al/logged"), "no access line under RUST_LOG=warn:\n{stderr}");
    assert!(!stderr.contains("gateway listening"), "RUST_LOG=warn still holds for the rest:\n{stderr}");
}

/// `access_log_format = "json"` gives JSON lines with text logs too: the
/// access line's message is one JSON object with the documented fields.
#[test]
fn a_json_access_log_is_json_under_text_logs() {
    let stderr = access_logged("access_log_format = \"json\"", "info");
    let line = stderr.lines().find(|l| l.contains("/al/logged")).unwrap_or_else(|| panic!("no access line:\n{stderr}"));
    let json = &line[line.find('{').unwrap_or_else(|| panic!("{line}"))..];
    let object: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!((object["path"].as_str(), object["status"].as_u64()), (Some("/al/logged"), Some(200)), "{line}");
    assert_eq!((object["method"].as_str(), object["route"].as_str()), (Some("GET"), Some("al")), "{line}");
    assert!(object["bytes_out"].is_u64() && object["total_ms"].is_f64(), "{line}");
    assert!(object.get("upstream").is_none(), "a field without a value is left out: {line}");
}

/// `--cache-control` adds that header to `/a`'s answers, whatever their
/// query, and `/-/count` says how many requests for `/a` arrived (what
/// `benches/compare`'s slow-upstream-cached counts upstream requests with).
#[test]
fn built_in_upstream_cache_control_and_count() {
    let addr = free_addr();
    let mut upstream = Command::new(BIN)
        .args(["upstream", "--listen", &addr, "--delay", "10ms", "--cache-control", "max-age=1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&addr);
    assert!(http_get(&addr, "/-/count").ends_with("\r\n\r\n0\n"));
    for path in ["/a", "/a?k=0", "/a?k=99"] {
        let a = http_get(&addr, path);
        assert!(a.starts_with("HTTP/1.1 200") && a.ends_with("ok"), "{path}: {a}");
        assert!(a.to_ascii_lowercase().contains("\r\ncache-control: max-age=1\r\n"), "{path}: {a}");
    }
    let hello = http_get(&addr, "/hello");
    assert!(!hello.to_ascii_lowercase().contains("cache-control"), "{hello}");
    let count = http_get(&addr, "/-/count");
    assert!(count.starts_with("HTTP/1.1 200") && count.ends_with("\r\n\r\n3\n"), "{count}");
    Command::new("kill").args(["-TERM", &upstream.id().to_string()]).status().unwrap();
    assert_eq!(upstream.wait().unwrap().code(), Some(0));
    let out = Command::new(BIN).args(["upstream", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--cache-control"));
}

/// A SIGTERM drains the gateway (exit code 0) from the moment it listens:
/// the handlers were installed only when the shutdown future was first
/// polled, after the listeners had started, so a SIGTERM sent once the
/// port answered (or after a first answer, on a loaded machine) could
/// find the default action and kill the process.
#[test]
fn a_sigterm_as_soon_as_it_listens_drains() {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let path = write_config(
            dir.path(),
            &format!(
                "[server]\nlisten = \"{addr}\"\n[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\n"
            ),
        );
        let mut gw =
            Command::new(BIN).args(["--config", path.to_str().unwrap()]).stderr(Stdio::null()).spawn().unwrap();
        wait_for(&addr);
        Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
        assert_eq!(gw.wait().unwrap().code(), Some(0), "killed, not drained");
    }
}

/// With `metrics.listen` on port 0 the admin listener's bound address is
/// logged on a line of its own, and it is where `/metrics` answers.
#[test]
fn the_admin_listeners_bound_address_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let path = write_config(
        dir.path(),
        &format!(
            "[server]\nlisten = \"{addr}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\n"
        ),
    );
    // Killed on drop: a failed assertion leaves nothing running.
    let mut gw = Running(
        Command::new(BIN)
            .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pipe = gw.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let admin = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("an admin listener line within 10 s");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("admin listener")) {
            break v["fields"]["addr"].as_str().unwrap().to_owned();
        }
    };
    assert!(!admin.ends_with(":0"), "{admin}");
    // Asked by its own name: the admin listener answers only that (or
    // localhost).
    let mut s = TcpStream::connect(&admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 200") && got.contains("# TYPE"), "at {admin}: {got}");
    Command::new("kill").args(["-TERM", &gw.0.id().to_string()]).status().unwrap();
    assert_eq!(gw.0.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
}

/// A second SIGTERM or SIGINT ends the drain at once. Before, it was
/// ignored: a client holding a connection (here, half a request head)
/// kept the process until `header_read_timeout` or `shutdown_timeout`,
/// and nothing short of SIGKILL ended it sooner.
#[test]
fn a_second_signal_ends_the_drain() {
    for second in ["-INT", "-TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let path = write_config(
            dir.path(),
            &format!(
                "[server]\nlisten = \"{addr}\"\nheader_read_timeout = \"60s\"\nshutdown_timeout = \"60s\"\n\
                 [[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\n"
            ),
        );
        let gw = Command::new(BIN).args(["--config", path.to_str().unwrap()]).stderr(Stdio::null()).spawn();
        let mut gw = Running(gw.unwrap());
        wait_for(&addr);
        let mut holder = TcpStream::connect(&addr).unwrap();
        holder.write_all(b"GET /r HTTP/1.1\r\nhost:").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let pid = gw.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(gw.0.try_wait().unwrap().is_none(), "{second}: the drain waits for the half head");
        let asked = Instant::now();
        Command::new("kill").args([second, &pid]).status().unwrap();
        let deadline = asked + Duration::from_secs(10);
        while gw.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{second}: still draining 10 s after the second signal");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(gw.0.wait().unwrap().code(), Some(0), "{second}");
    }
}

/// `gateway check | head`: a closed stdout ends the output, not the
/// process with a panic (exit 101 and "failed printing to stdout").
#[test]
fn check_into_a_closed_pipe_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\n");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN).args(["check", "--config", path.to_str().unwrap()]).stdout(writer).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A closed stderr (a log shipper gone) is not a panic: the gateway starts,
/// serves, logs into nothing and exits 0 on SIGTERM, where its first log
/// line made it exit 101; a bad configuration still exits 64.
#[test]
fn a_closed_stderr_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let text =
        format!("[server]\nlisten = \"{addr}\"\n[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\n");
    let path = write_config(dir.path(), &text);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let gw = Command::new(BIN).args(["--config", path.to_str().unwrap()]).stderr(writer).spawn();
    let mut gw = Running(gw.unwrap());
    wait_for(&addr);
    assert!(http_get(&addr, "/r").starts_with("HTTP/1.1 200"));
    Command::new("kill").args(["-TERM", &gw.0.id().to_string()]).status().unwrap();
    assert_eq!(gw.0.wait().unwrap().code(), Some(0));
    let bad = write_config(dir.path(), "[server]\nlisten = 5\n");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN).args(["check", "--config", bad.to_str().unwrap()]).stderr(writer).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}
