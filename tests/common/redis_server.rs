//! A `redis-server` of a test's own, for the limits shared through Redis:
//! plain, or TLS only with a certificate from a CA made in the test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::pki::Pki;
use super::process::free_port;

/// A `redis-server` of this test's own on a free loopback port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// `--requirepass`, when set.
    pub password: Option<String>,
    /// TLS only (`--port 0 --tls-port`): the CA (`ca.pem`) and the server's
    /// certificate for 127.0.0.1 and localhost (`redis.pem`, `redis.key`).
    pub tls: Option<Pki>,
}

impl Redis {
    /// Starts one; `None` (the test is skipped, said on stderr) when the
    /// binary is absent outside CI. Under `CI=true` its absence fails.
    pub fn start() -> Option<Redis> {
        Redis::start_with(None)
    }

    pub fn start_with(password: Option<String>) -> Option<Redis> {
        if !installed() {
            return None;
        }
        let mut redis = Redis { port: free_port(), child: None, password, tls: None };
        redis.first_spawn().unwrap_or_else(|why| panic!("{why}"));
        Some(redis)
    }

    /// One that speaks TLS only; `None` (skipped, said on stderr) when
    /// redis-server is absent or built without TLS, outside CI.
    pub fn start_tls() -> Option<Redis> {
        if !installed() {
            return None;
        }
        let pki = Pki::new();
        pki.issue("redis", &["127.0.0.1", "localhost"], false);
        let mut redis = Redis { port: free_port(), child: None, password: None, tls: Some(pki) };
        if let Err(why) = redis.first_spawn() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "redis-server with TLS did not start: {why}");
            eprintln!("SKIPPED: this redis-server does not start with TLS (built without it?): {why}");
            return None;
        }
        Some(redis)
    }

    /// The first start, on a new free port each try: between `free_port`
    /// closing its probe and redis-server binding, another test's outgoing
    /// connection may take the port (CI saw `bind: Address already in use`).
    /// A restart ([`Redis::spawn`]) keeps its port, as the tests need.
    fn first_spawn(&mut self) -> Result<(), String> {
        let mut tries = 0;
        loop {
            match self.try_spawn() {
                Err(why) if self.child.is_none() && tries < 4 => {
                    eprintln!("redis-server did not start on port {} ({why}); another port", self.port);
                    tries += 1;
                    self.port = free_port();
                }
                done => return done,
            }
        }
    }

    /// Starts it again on its port (the outage tests need the same one):
    /// if the port is briefly taken, after a moment, four times more.
    pub fn spawn(&mut self) {
        for tries in 0.. {
            match self.try_spawn() {
                Ok(()) => return,
                Err(why) if tries < 4 => {
                    eprintln!("redis-server did not start again on port {} ({why}); again", self.port);
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    /// Starts the process and waits (up to 10 s) for it to answer a PING;
    /// what it said when it exits first.
    fn try_spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut args: Vec<String> =
            ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(String::from).into();
        match &self.tls {
            None => args.extend(["--port".to_owned(), port]),
            Some(pki) => {
                // Its log is read when it exits; only this start's lines.
                let _ = std::fs::remove_file(pki.path("redis.log"));
                args.extend(["--port", "0", "--tls-auth-clients", "no", "--tls-port"].map(String::from));
                args.push(port);
                let files = [
                    ("--tls-cert-file", "redis.pem"),
                    ("--tls-key-file", "redis.key"),
                    ("--tls-ca-cert-file", "ca.pem"),
                    // Its log, to say why when it will not start.
                    ("--logfile", "redis.log"),
                ];
                for (flag, name) in files {
                    args.extend([flag.to_owned(), pki.path(name).display().to_string()]);
                }
            }
        }
        if let Some(pw) = &self.password {
            args.extend(["--requirepass".to_owned(), pw.clone()]);
        }
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cmd(&["PING"]).is_none() {
            let child = self.child.as_mut().expect("just started");
            if let Ok(Some(status)) = child.try_wait() {
                let mut said = String::new();
                let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut said);
                if let Some(pki) = &self.tls {
                    said += &std::fs::read_to_string(pki.path("redis.log")).unwrap_or_default();
                }
                self.child = None;
                return Err(format!("redis-server exited ({status}): {}", said.trim()));
            }
            if Instant::now() > deadline {
                return Err(format!("redis-server did not come up on port {}", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The URL with the password, for the test's own commands.
    pub fn admin_url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{}", percent(pw), self.port),
            None => self.url(),
        }
    }

    /// One command, with a short-lived connection of its own (trusting the
    /// test's CA when Redis speaks TLS).
    pub fn cmd(&self, args: &[&str]) -> Option<redis::Value> {
        let client = match &self.tls {
            None => redis::Client::open(self.admin_url()).ok()?,
            Some(pki) => {
                let root_cert = Some(std::fs::read(pki.path("ca.pem")).ok()?);
                redis::Client::build_with_tls(self.url(), redis::TlsCertificates { client_tls: None, root_cert })
                    .ok()?
            }
        };
        let mut conn = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).ok()
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        Command::new("kill").args([sig, &pid]).status().unwrap();
    }

    /// Stops the process for good (until [`Redis::spawn`]).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped process is killed all the same.
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
        }
        self.kill();
    }
}

/// Whether redis-server is there; `false` (the test is skipped, said on
/// stderr) outside CI, and its absence fails under `CI=true`.
fn installed() -> bool {
    let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "redis-server is not installed; .ci/run installs it (apt-get install redis-server)"
        );
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
    }
    found
}

/// Every byte but unreserved ones percent-encoded, for a password in a URL.
fn percent(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}
