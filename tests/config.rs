//! A newcomer's broken configurations, run through the binary as they
//! would run it: each exits 64 before anything binds, and its one line
//! names the file, the line and the key path, says what is wrong and what
//! is accepted, and never repeats a secret the file holds.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gateway");

/// An upstream, and a route's head, that the cases build on.
const UP: &str = "[upstreams.app]\nurl = \"http://127.0.0.1:9\"\n[upstreams.b]\nurl = \"http://127.0.0.1:8\"\n";
const ROUTE: &str = "[[routes]]\nname = \"x\"\nprefix = \"/x\"\n";

/// One broken file: what follows `[server]`'s `listen` (more `[server]`
/// keys, or other tables; top-level keys, written before it, start with
/// `^`), the key the error names, what it says, and a text it must not
/// show.
struct Case {
    body: String,
    key: &'static str,
    says: &'static [&'static str],
    secret: Option<&'static str>,
}

fn case(body: impl Into<String>, key: &'static str, says: &'static [&'static str]) -> Case {
    Case { body: body.into(), key, says, secret: None }
}

fn route(rest: &str) -> String {
    format!("{UP}{ROUTE}{rest}\n")
}

fn cases() -> Vec<Case> {
    let secret = |body: String, key, says, secret| Case { body, key, says, secret: Some(secret) };
    vec![
        case("\n[servr]\nidle_timeout = \"5s\"\n", "servr", &["unknown key; did you mean `server`?"]),
        case("\n[logging]\nlevel = \"debug\"\n", "logging", &["unknown key; the keys here are `server`"]),
        case("listne = \"127.0.0.1:1\"\n", "server.listne", &["did you mean `listen`?"]),
        case("http1 = \"hpyer\"\n", "server.http1", &["\"hpyer\": use \"hyper\" or \"gateway\""]),
        case("access_log = \"ture\"\n", "server.access_log", &["invalid type: string \"ture\", expected a boolean"]),
        case("worker_threads = -1\n", "server.worker_threads", &["expected a whole number, 0 or more"]),
        case("max_body = \"-1MiB\"\n", "server.max_body", &["a size cannot be negative", "\"64KiB\""]),
        case("max_body = \"10 MB!\"\n", "server.max_body", &["a size is a number and a unit"]),
        case("max_body = 1.5\n", "server.max_body", &["a fraction needs a unit, e.g. \"1.5MiB\""]),
        case("idle_timeout = \"5\"\n", "server.idle_timeout", &["a duration needs its unit: \"5s\" or \"5ms\""]),
        case("idle_timeout = \"0.5\"\n", "server.idle_timeout", &["needs its unit: \"0.5s\""]),
        case("idle_timeout = \"5 Sec\"\n", "server.idle_timeout", &["units are written in lower case: \"5 sec\""]),
        case("trusted_proxies = \"10.0.0.0/8\"\n", "server.trusted_proxies", &["expected a list", "in brackets"]),
        case("trusted_proxies = [\"10.0.0.0/33\"]\n", "server.trusted_proxies[0]", &["invalid CIDR \"10.0.0.0/33\""]),
        case("\n[metrics]\nlisten = \"9090\"\n", "metrics.listen", &["a port alone is not an address"]),
        case("\n[upstreams.app]\nulr = \"http://127.0.0.1:1\"\n", "upstreams.app.ulr", &["did you mean `url`?"]),
        case(format!("{UP}[upstreams.c]\n"), "upstreams.c.url", &["set exactly one of url, endpoints and discover"]),
        case("\n[upstreams.c]\nurl = \"127.0.0.1:9\"\n", "upstreams.c.url", &["missing scheme (use http://host:port)"]),
        case("^upstreams = \"app\"\n", "upstreams", &["invalid type: string \"app\", expected a table"]),
        case(
            "\n[upstreams.c]\nendpoints = [{ url = \"http://127.0.0.1:1\", wieght = 2 }]\n",
            "upstreams.c.endpoints[0].wieght",
            &["unknown key; did you mean `weight`?"],
        ),
        case(
            "\n[upstreams.c]\nurl = \"http://127.0.0.1:1\"\nbalance = \"round-robin\"\n",
            "upstreams.c.balance",
            &["use \"least_request\" or \"round_robin\""],
        ),
        case(route("upstream = \"ghost\""), "routes[0].upstream", &["unknown upstream \"ghost\" (known: app, b)"]),
        case(route("upstrem = \"app\""), "routes[0].upstrem", &["did you mean `upstream`?"]),
        case(
            route("upstream = \"app\"\nmethods = [\"GET\", \"G T\"]"),
            "routes[0].methods[1]",
            &["is not an HTTP method"],
        ),
        case(route("upstream = \"app\"\nmethods = \"GET\""), "routes[0].methods", &["expected a list"]),
        case(route("upstream = \"app\"\nmethods = []"), "routes[0].methods", &["is empty"]),
        case(route("upstream = \"app\"\ntimeout = 5"), "routes[0].timeout", &["needs its unit: \"5s\""]),
        case(route("upstream = \"app\"\nhost = \"upsteam\""), "routes[0].host", &["use \"preserve\" or \"upstream\""]),
        case(route("upstream = { name = \"app\" }"), "routes[0].upstream", &["invalid type: table, expected a string"]),
        case(route("upstream = \"app\"\ncache = \"64MiB\""), "routes[0].cache", &["expected a table (cache = {"]),
        case(
            route("upstream = \"app\"\ncache = { max_sise = \"1MiB\" }"),
            "routes[0].cache.max_sise",
            &["`max_size`?"],
        ),
        case(
            route(
                "split = [{ upstream = \"app\", weight = 1 }, { upstream = \"b\", weight = 1 }]\nsticky = { cookei = \"s\" }",
            ),
            "routes[0].sticky.cookei",
            &["unknown key; did you mean `cookie`?"],
        ),
        case(
            route("upstream = \"app\"\nheaders = { x-canary = { regx = \"^1$\" } }"),
            "routes[0].headers.x-canary.regx",
            &["did you mean `regex`?"],
        ),
        case(route("upstream = \"app\"\nquery = { v = 2 }"), "routes[0].query.v", &["write the value as a text"]),
        case(
            route("upstream = \"app\"\nrate_limit = { rate = \"100 per second\" }"),
            "routes[0].rate_limit.rate",
            &["use COUNT/PERIOD, e.g. \"100/s\""],
        ),
        case(
            format!("{}{ROUTE}upstream = \"app\"\n", route("upstream = \"app\"")),
            "routes[1].name",
            &["duplicate route name \"x\" (also routes[0])"],
        ),
        case(
            format!("{}[[routes]]\nname = \"y\"\nprefix = \"/x\"\nupstream = \"b\"\n", route("upstream = \"app\"")),
            "routes[1].prefix",
            &["can never be chosen", "comes first with the same prefix"],
        ),
        case("\n[routes]\nname = \"x\"\n", "routes", &["each route is its own [[routes]] table"]),
        case(route("respond = { staus = 200 }"), "routes[0].respond.staus", &["did you mean `status`?"]),
        secret(
            "^rate_limit_store = \"redis://:hunter2SECRET@127.0.0.1:6379\"\n".into(),
            "rate_limit_store",
            &["expected a table ([rate_limit_store])"],
            "hunter2SECRET",
        ),
        secret(
            route("respond = { status = 200 }\nauth = \"Bearer SECRETTOKEN\""),
            "routes[0].auth",
            &["expected a table (auth = {"],
            "SECRETTOKEN",
        ),
        secret(
            route("upstream = \"app\"\nrequest_headers = { set = { authorization = \"Bearer SECRETX\" }, remov = [] }"),
            "routes[0].request_headers.remov",
            &["did you mean `remove`?"],
            "SECRETX",
        ),
        secret(
            "\n[upstreams.c]\nurl = \"http://user:SECRETPW@127.0.0.1:1/\"\n".into(),
            "upstreams.c.url",
            &["credentials are not supported"],
            "SECRETPW",
        ),
    ]
}

/// The gateway run on `path` (to serve, or only to check), killed if it
/// has not exited within a few seconds (a refused file never starts).
fn run(args: &[&str], path: &Path) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(path)
        .env_remove("GATEWAY_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_newcomers_broken_files_are_refused_with_where_what_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    // A port held throughout: a file accepted by mistake fails to listen
    // rather than serving on.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let head = format!("[server]\nlisten = \"127.0.0.1:{}\"\n", held.local_addr().unwrap().port());
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (i, c) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case{i}.toml"));
        let text = match c.body.strip_prefix('^') {
            Some(top) => format!("{top}{head}"),
            None => format!("{head}{}", c.body),
        };
        std::fs::write(&path, text).unwrap();
        for args in [&[][..], &["check"][..]] {
            let out = run(args, &path);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let text = &c.body;
            assert_eq!(out.status.code(), Some(64), "{args:?} {text}: {stderr}");
            let at = format!("{}:", path.display());
            assert!(stderr.contains(&at), "{text}: names the file: {stderr}");
            assert!(stderr.contains(&format!(": {}: ", c.key)), "{text}: names {}: {stderr}", c.key);
            for says in c.says {
                assert!(stderr.contains(says), "{text}: says {says:?}: {stderr}");
            }
            if let Some(secret) = c.secret {
                assert!(!stderr.contains(secret), "{text}: shows the secret: {stderr}");
            }
            assert_eq!(stderr.lines().count(), 1, "{text}: one line: {stderr}");
        }
    }
    drop(held);
}

/// A method outside the registry loads, as any HTTP token always did (a
/// custom one, `BAN`), and `check` warns of one that looks like a typo.
#[test]
fn a_misspelt_method_loads_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, route("upstream = \"app\"\nmethods = [\"get\", \"GTE\", \"BAN\"]")).unwrap();
    let out = run(&["check"], &path);
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("warning: routes[0].methods[1]: \"GTE\" is not a registered HTTP method; did you mean \"GET\"?"),
        "{said}"
    );
    assert!(said.contains("warning: routes[0].methods[2]: \"BAN\" is not in the IANA"), "{said}");
    assert!(!said.contains("methods[0]"), "{said}");
}

/// A mistake made through an environment override is blamed on the
/// variable, with the same words.
#[test]
fn an_override_is_named_as_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "[server]\nidle_timeout = \"5s\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .env("GATEWAY__SERVER__LISTEN", "localhost:8080")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let want = "environment variable GATEWAY__SERVER__LISTEN: server.listen: invalid socket address \
                \"localhost:8080\": a host name is not taken, only an IP address: write \"127.0.0.1:8080\"";
    assert!(stderr.contains(want), "{stderr}");
}
