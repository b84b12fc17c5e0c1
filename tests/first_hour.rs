//! A newcomer's first hour with the binary: every configuration error
//! names its source (the file and line, or the environment variable) and
//! its key, a start that cannot listen names the busy address and its key,
//! and the zero-config quick start moves off a busy port.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)] // the TLS tests use the rest
#[path = "common/pki.rs"]
mod pki;
#[path = "common/process.rs"]
mod process;

use process::{Running, free_addr, free_port, http_get};

/// The binary under test; `GATEWAY_TEST_BIN` runs these tests against
/// another build (an older one, to see a test fail before its fix).
fn bin() -> String {
    std::env::var("GATEWAY_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gateway").to_owned())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn check(path: &Path, env: &[(&str, &str)]) -> (Output, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["check", "--config", path.to_str().unwrap()]).env_remove("GATEWAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// Unknown keys are named by their path and line, with the close name
/// suggested and the test-only `panic` key never offered; a TOML syntax
/// error names the file once, with line and column; a type error inside
/// a route keeps the dot after its index.
#[test]
fn file_errors_name_the_key_path_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[server]\nlistne = \"127.0.0.1:8080\"\n", ":2: server.listne: unknown key; did you mean `listen`?"),
        (
            "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\nmethod = ['GET']\n",
            ":5: routes[0].method: unknown key; did you mean `methods`?",
        ),
        (
            "[[routes]]\nname = 'r'\nprefix = '/r'\nzzz = 1\n",
            ":4: routes[0].zzz: unknown key; the keys here are `name`",
        ),
        ("[sever]\nlisten = \"127.0.0.1:8080\"\n", ":1: sever: unknown key; did you mean `server`?"),
        (
            "[[routes]]\nname = 'a'\nprefix = '/a'\nrespond = { status = 200 }\n\n[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 'teapot' }\n",
            ":9: routes[1].respond.status: invalid type",
        ),
        ("[server]\nlisten = \n", ":2:10: TOML syntax error: "),
        (
            "[[routes]]\nname = 'r'\nprefix = '/r'\ntimeout = 'fast'\nupstream = 'a'\n[upstreams.a]\nurl = 'http://127.0.0.1:9'\n",
            ":4: routes[0].timeout: invalid duration",
        ),
    ];
    for (text, want) in cases {
        let path = write(dir.path(), "typo.toml", text);
        let (out, stderr) = check(&path, &[]);
        assert_eq!(out.status.code(), Some(64), "{text}: {stderr}");
        let shown = path.display().to_string();
        assert!(stderr.contains(&format!("{shown}{want}")), "{text}: wanted {want:?} in: {stderr}");
        assert_eq!(stderr.matches(&shown).count(), 1, "the file is named once: {stderr}");
        assert!(!stderr.contains("panic"), "{stderr}");
        assert!(!stderr.contains(": -:"), "{stderr}");
    }
}

/// A mistake in an environment override is blamed on the variable, not on
/// the file it overrides: an unknown top-level key too, which only the
/// variable holds, and a list (the file's routes among them), which no
/// variable can set.
#[test]
fn override_errors_name_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let route = "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\n";
    let upstream = "[upstreams.api]\nurl = 'http://127.0.0.1:9'\n";
    let text = format!("[server]\nlisten = \"127.0.0.1:{}\"\n\n{upstream}{route}", free_port());
    let path = write(dir.path(), "base.toml", &text);
    let no_list =
        "is a list, and lists (routes, server.trusted_proxies and the like) cannot be set from the environment";
    let routes = format!("environment variable GATEWAY__ROUTES__0__TIMEOUT: routes: {no_list}");
    let proxies = format!("environment variable GATEWAY__SERVER__TRUSTED_PROXIES: server.trusted_proxies: {no_list}");
    let cases = [
        (
            ("GATEWAY__SERVER__LISTN", "127.0.0.1:1"),
            "environment variable GATEWAY__SERVER__LISTN: server.listn: unknown key; did you mean `listen`?",
        ),
        (
            ("GATEWAY__SERVER__LISTEN", "nonsense"),
            "environment variable GATEWAY__SERVER__LISTEN: server.listen: invalid socket address \"nonsense\"",
        ),
        (
            ("GATEWAY__SERVR__LISTEN", "127.0.0.1:1"),
            "environment variable GATEWAY__SERVR__LISTEN: servr: unknown key; did you mean `server`?",
        ),
        (
            ("GATEWAY__METRIC__LISTEN", "127.0.0.1:1"),
            "environment variable GATEWAY__METRIC__LISTEN: metric: unknown key; did you mean `metrics`?",
        ),
        (("GATEWAY__ROUTES__0__TIMEOUT", "1s"), routes.as_str()),
        (("GATEWAY__SERVER__TRUSTED_PROXIES", "10.0.0.0/8"), proxies.as_str()),
        // An upstream only the variable makes, in a file that has others;
        // a variable under a key the file sets.
        (
            ("GATEWAY__UPSTREAMS__NEW__MAX_REQUESTS", "8"),
            "environment variable GATEWAY__UPSTREAMS__NEW__MAX_REQUESTS: upstreams.new",
        ),
        (
            ("GATEWAY__UPSTREAMS__API__URL__X", "y"),
            "environment variable GATEWAY__UPSTREAMS__API__URL__X: upstreams.api.url",
        ),
    ];
    for ((var, value), want) in cases {
        let (out, stderr) = check(&path, &[(var, value)]);
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        assert!(stderr.contains(want), "wanted {want:?} in: {stderr}");
        assert!(!stderr.contains("base.toml"), "blames the file: {stderr}");
    }
    // The file's own error, beside a variable of the same upstream that is
    // fine, is the file's.
    let bad =
        write(dir.path(), "bad.toml", &format!("[upstreams.api]\nurl = 'http://127.0.0.1:9'\nqueue = -1\n{route}"));
    let (out, stderr) = check(&bad, &[("GATEWAY__UPSTREAMS__API__QUEUE_TIMEOUT", "2s")]);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("bad.toml:3: upstreams.api.queue"), "{stderr}");
    // With no file given, the embedded default is not blamed either.
    let out = Command::new(bin())
        .arg("check")
        .current_dir(dir.path())
        .env_remove("GATEWAY_CONFIG")
        .env("GATEWAY__SERVR__LISTEN", "127.0.0.1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("environment variable GATEWAY__SERVR__LISTEN: servr: unknown key"), "{stderr}");
    assert!(!stderr.contains("embedded default"), "blames the default: {stderr}");
}

/// With `server.listen` free and `metrics.listen` taken, the start names
/// the busy address and its key (and how to move it), not the free one.
#[test]
fn a_busy_address_is_named_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let free = free_addr();
    let text = format!("[server]\nlisten = \"{free}\"\n[metrics]\nlisten = \"{busy}\"\n");
    let path = write(dir.path(), "gw.toml", &text);
    let out = Command::new(bin()).args(["--config", path.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let want = format!("cannot listen on {busy} (metrics.listen): ");
    assert!(stderr.contains(&want), "wanted {want:?} in: {stderr}");
    assert!(stderr.contains("GATEWAY__METRICS__LISTEN"), "says how to move it: {stderr}");
    assert!(!stderr.contains(&free), "names the free address: {stderr}");
}

/// A TLS file that cannot be used is named by its key: `cert`, `key` or
/// `client_ca`.
#[test]
fn tls_file_errors_name_their_key() {
    let pki = pki::Pki::new();
    pki.issue("gw", &["localhost"], false);
    std::fs::write(pki.path("junk.pem"), "not a certificate\n").unwrap();
    let cases = [
        ("cert = 'junk.pem'\nkey = 'gw.key'\n", "server.tls.cert"),
        ("cert = 'gw.pem'\nkey = 'junk.pem'\n", "server.tls.key"),
        ("cert = 'gw.pem'\nkey = 'ca.pem'\n", "server.tls.key"),
        ("cert = 'gw.pem'\nkey = 'gw.key'\nclient_ca = 'junk.pem'\n", "server.tls.client_ca"),
        ("cert = 'gw.pem'\nkey = 'gw.key'\nclient_ca = 'missing.pem'\n", "server.tls.client_ca"),
    ];
    for (tls, key) in cases {
        let path = write(pki.dir.path(), "gw.toml", &format!("[server.tls]\n{tls}"));
        let (out, stderr) = check(&path, &[]);
        assert_eq!(out.status.code(), Some(64), "{tls}: {stderr}");
        assert!(stderr.contains(&format!(": {key}: ")), "{tls}: wanted {key} in: {stderr}");
    }
}

/// The embedded default run with `env`, from an empty folder: its stdout
/// once `addr` answers, or its stderr if it exits first.
fn run_embedded(env: &[(&str, &str)], addr: &str) -> Result<(Running, String), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir.path()).env_remove("GATEWAY_CONFIG").stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut gw = Running(cmd.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        if gw.0.try_wait().unwrap().is_some() {
            let mut stderr = String::new();
            gw.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            return Err(stderr);
        }
        assert!(Instant::now() < deadline, "{addr} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = String::new();
    let mut pipe = gw.0.stdout.take().unwrap();
    let mut buf = [0u8; 4096];
    while !stdout.contains("Prometheus metrics") {
        let n = pipe.read(&mut buf).unwrap();
        assert!(n > 0, "stdout ended: {stdout}");
        stdout.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok((gw, stdout))
}

/// Stops `child` with SIGTERM; it exits 0.
fn stop(mut child: Running) {
    Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

/// The zero-config quick start moves off 8000 and 8080 by one override
/// each: the demo upstream follows `upstreams.service_a.url`, and the
/// banner says where it is; a busy demo port is named with the variable
/// that moves it.
#[test]
fn the_quick_start_moves_off_busy_ports() {
    let gw = free_addr();
    let demo = free_addr();
    let url = format!("http://{demo}");
    let env = [("GATEWAY__SERVER__LISTEN", gw.as_str()), ("GATEWAY__UPSTREAMS__SERVICE_A__URL", url.as_str())];
    let (child, stdout) = run_embedded(&env, &gw).unwrap_or_else(|e| panic!("exited: {e}"));
    assert!(stdout.contains(&format!("demo upstream (GET /a waits 1s): http://{demo}")), "{stdout}");
    let b = http_get(&gw, "/b");
    assert!(b.starts_with("HTTP/1.1 200") && b.ends_with("ok"), "{b}");
    stop(child);

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", taken.local_addr().unwrap());
    let env = [("GATEWAY__SERVER__LISTEN", gw.as_str()), ("GATEWAY__UPSTREAMS__SERVICE_A__URL", url.as_str())];
    let stderr = run_embedded(&env, &gw).map(|(c, _)| stop(c)).expect_err("starts with its demo port taken");
    assert!(
        stderr.contains("upstreams.service_a.url") && stderr.contains("GATEWAY__UPSTREAMS__SERVICE_A__URL"),
        "{stderr}"
    );
}

/// A gateway started before its app serves it soon after the app comes
/// up: until a check has passed, checks come sooner than `interval` (an
/// hour here) and the first pass alone makes the endpoint healthy.
#[test]
fn an_app_that_starts_after_the_gateway_is_served_soon() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, app) = (free_addr(), free_addr());
    let text = format!(
        "[server]\nlisten = \"{gw}\"\n[upstreams.app]\nurl = \"http://{app}\"\n[upstreams.app.health]\npath = \"/healthz\"\ninterval = \"1h\"\nhealthy_after = 2\n[[routes]]\nname = 'app'\nprefix = '/'\nupstream = 'app'\n"
    );
    let path = write(dir.path(), "gw.toml", &text);
    let gateway =
        Running(Command::new(bin()).args(["--config", path.to_str().unwrap()]).stderr(Stdio::null()).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&gw).is_err() {
        assert!(Instant::now() < deadline, "{gw} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(http_get(&gw, "/readyz").starts_with("HTTP/1.1 503"), "not ready before its app");
    let upstream = Running(
        Command::new(bin())
            .args(["upstream", "--listen", &app, "--delay", "10ms"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !http_get(&gw, "/readyz").starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "never ready after its app came up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = http_get(&gw, "/a");
    assert!(a.starts_with("HTTP/1.1 200") && a.ends_with("ok"), "{a}");
    stop(gateway);
    stop(upstream);
}

/// Each command's help says what it takes and its exit status; `check`
/// without a file checks the embedded default; a wrong command line is
/// exit 64 as a wrong configuration is.
#[test]
fn help_says_what_each_command_takes_and_its_exit_status() {
    let help = |args: &[&str]| {
        let out = Command::new(bin()).args(args).env_remove("GATEWAY_CONFIG").output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for args in [&["--help"][..], &["check", "--help"], &["upstream", "--help"]] {
        assert!(help(args).contains("64"), "{args:?} names exit status 64: {}", help(args));
    }
    assert!(!help(&["upstream", "--help"]).contains("--config"), "upstream takes no --config");
    assert!(help(&["check", "--help"]).contains("--config"));

    let out = Command::new(bin()).arg("check").env_remove("GATEWAY_CONFIG").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("embedded default: ok"), "{stdout}");
    let out = Command::new(bin()).arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}

/// `check` prints a `file` route's path absolute, as a `dir` route's is.
#[test]
fn check_prints_file_and_dir_paths_alike() {
    let out = Command::new(bin())
        .args(["check", "--config", "config/gateway.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    for kind in [" file ", " dir "] {
        let line = stdout.lines().find(|l| l.contains(kind)).unwrap_or_else(|| panic!("{kind}: {stdout}"));
        let path = line.rsplit(kind).next().unwrap();
        assert!(Path::new(path).is_absolute(), "{line}");
    }
}

/// An upstream no route uses is valid, but `check` warns of it; a split's
/// members and a mirror's shadow are used.
#[test]
fn check_warns_of_an_upstream_no_route_uses() {
    let dir = tempfile::tempdir().unwrap();
    let up = |name: &str| format!("[upstreams.{name}]\nurl = 'http://127.0.0.1:9'\n");
    let text = format!(
        "{}{}{}{}{}[[routes]]\nname = 'app'\nprefix = '/'\nupstream = 'app'\n\
         [[routes]]\nname = 'api'\nprefix = '/api'\nmirror = {{ upstream = 'shadow' }}\n\
         split = [{{ upstream = 'v1', weight = 95 }}, {{ upstream = 'v2', weight = 5 }}]\n",
        up("app"),
        up("spare"),
        up("v1"),
        up("v2"),
        up("shadow")
    );
    let path = write(dir.path(), "gw.toml", &text);
    let (out, stderr) = check(&path, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("warning: upstream spare is used by no route"), "{stdout}");
    for used in ["app", "v1", "v2", "shadow"] {
        assert!(!stdout.contains(&format!("upstream {used} is used by no route")), "{used}: {stdout}");
    }
}

/// The ejection's log line names how long by the key that sets it.
#[test]
fn the_ejection_log_names_its_time_by_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, dead) = (free_addr(), free_addr());
    let text = format!(
        "[server]\nlisten = \"{gw}\"\n[upstreams.app]\nurl = \"http://{dead}\"\n[upstreams.app.outlier]\nconsecutive_failures = 1\n[[routes]]\nname = 'app'\nprefix = '/'\nupstream = 'app'\n"
    );
    let path = write(dir.path(), "gw.toml", &text);
    let mut gateway =
        Running(Command::new(bin()).args(["--config", path.to_str().unwrap()]).stderr(Stdio::piped()).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&gw).is_err() {
        assert!(Instant::now() < deadline, "{gw} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(http_get(&gw, "/").starts_with("HTTP/1.1 502"));
    let mut stderr = gateway.0.stderr.take().unwrap();
    stop(gateway);
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    let line = log.lines().find(|l| l.contains("endpoint ejected")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("ejection_time=30s") && !line.contains("for_"), "{line}");
}
