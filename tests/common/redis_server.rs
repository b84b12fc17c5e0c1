//! A `redis-server` of a test's own, for the limits shared through Redis.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of this test's own on a free loopback port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// `--requirepass`, when set.
    pub password: Option<String>,
}

impl Redis {
    /// Starts one; `None` (the test is skipped, said on stderr) when the
    /// binary is absent outside CI. Under `CI=true` its absence fails.
    pub fn start() -> Option<Redis> {
        Redis::start_with(None)
    }

    pub fn start_with(password: Option<String>) -> Option<Redis> {
        let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_ok();
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "redis-server is not installed; .ci/run installs it (apt-get install redis-server)"
            );
            eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut redis = Redis { port, child: None, password };
        redis.spawn();
        Some(redis)
    }

    pub fn spawn(&mut self) {
        let mut args = vec!["--port".to_owned(), self.port.to_string()];
        args.extend(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(str::to_owned));
        if let Some(pw) = &self.password {
            args.extend(["--requirepass".to_owned(), pw.clone()]);
        }
        let child = Command::new("redis-server").args(&args).stdout(Stdio::null()).spawn().expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cmd(&["PING"]).is_none() {
            assert!(Instant::now() < deadline, "redis-server did not come up on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The URL with the password, for the test's own commands.
    pub fn admin_url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{}", percent(pw), self.port),
            None => self.url(),
        }
    }

    /// One command, with a short-lived connection of its own.
    pub fn cmd(&self, args: &[&str]) -> Option<redis::Value> {
        let client = redis::Client::open(self.admin_url()).ok()?;
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

/// Every byte but unreserved ones percent-encoded, for a password in a URL.
fn percent(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}
