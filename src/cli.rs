//! The command line: `gateway [--config FILE]`, `gateway upstream`,
//! `gateway check [--config FILE]`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::config::{self, Config, Source};
use crate::net::{bind, bind_for};
use crate::{Gateway, demo};

/// `println!`, but a closed stdout (`gateway check | head`) is not a panic:
/// the rest of the output has nowhere to go, and is dropped.
macro_rules! say {
    (to $out:expr, $($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
    ($($arg:tt)*) => { say!(to std::io::stdout(), $($arg)*) };
}

/// `eprintln!`, likewise for a closed stderr: the exit status still tells.
macro_rules! complain {
    ($($arg:tt)*) => { say!(to std::io::stderr(), $($arg)*) };
}

/// The log's writer: stderr, where a line that cannot be written is
/// dropped. tracing-subscriber reports a failed write with `eprintln!`,
/// which panics when stderr is closed (a log shipper that went away), and
/// the process then exited 101 at its next line.
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// EX_USAGE from sysexits.h: the configuration or command line is wrong.
pub const EXIT_CONFIG: u8 = 64;
/// Where the embedded default starts the built-in slow upstream.
pub const DEMO_UPSTREAM: &str = "127.0.0.1:8000";

#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    about = "A reverse-proxy gateway with per-route timeouts and Prometheus metrics",
    after_help = "Exit status: 0 after SIGTERM or SIGINT; 64 when the configuration or the command line is wrong \
                  (nothing was bound); 1 when it cannot start (an address taken, say)."
)]
struct Cli {
    /// Configuration file (TOML). Without one, the embedded default runs, with
    /// the built-in slow upstream where upstreams.service_a.url points
    /// (127.0.0.1:8000; move it with GATEWAY__UPSTREAMS__SERVICE_A__URL).
    #[arg(long, short, env = "GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    /// Reload the configuration file when it changes on disk (as
    /// `server.watch_config = true`).
    #[arg(long)]
    watch: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the built-in slow upstream ("service A"): GET /a (any query)
    /// waits the delay then answers "ok"; GET /hello and GET /healthz (for
    /// health checks) answer at once; GET /-/count answers how many requests
    /// for /a have arrived.
    #[command(
        after_help = "Exit status: 0 after SIGTERM or SIGINT; 1 when it cannot listen; 64 when the command line is wrong."
    )]
    Upstream {
        /// Address to listen on.
        #[arg(long, default_value = DEMO_UPSTREAM)]
        listen: SocketAddr,
        /// How long GET /a waits, e.g. "1s", "250ms".
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        delay: Duration,
        /// A Cache-Control header value for GET /a's answers, e.g.
        /// "max-age=1" (none by default).
        #[arg(long, value_parser = parse_header_value)]
        cache_control: Option<http::HeaderValue>,
    },
    /// Validate a configuration file and print the resolved routes.
    #[command(
        after_help = "Exit status: 0 when the configuration is valid; 64 when it is not, or the command line is wrong."
    )]
    Check {
        /// Configuration file (TOML) to check; without one, the embedded
        /// default.
        #[arg(long, short, env = "GATEWAY_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// Entry point of the `gateway` binary.
pub fn main() -> ExitCode {
    // A wrong command line is EX_USAGE too, as a wrong configuration is.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_CONFIG } else { 0 });
        }
    };
    init_tracing(cli.log_format);
    match cli.command {
        Some(Command::Upstream { listen, delay, cache_control }) => {
            run_upstream(listen, demo::Upstream { delay, cache_control })
        }
        Some(Command::Check { config }) => check(config.or(cli.config)),
        None => run_gateway(cli.config, cli.log_format, cli.watch),
    }
}

fn parse_header_value(text: &str) -> Result<http::HeaderValue, String> {
    http::HeaderValue::from_str(text).map_err(|_| format!("not a valid header value: {text:?}"))
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        // The access log is switched by `server.access_log`, not by the log
        // level: its lines (INFO, target `access`) pass whatever RUST_LOG says.
        .add_directive("access=info".parse().expect("a valid directive"));
    // Colour only on a terminal: container and journald logs get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(|| LogWriter).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => {
            crate::access::JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
            builder.json().init()
        }
    }
}

/// The configuration from `path`, or the embedded default with the folder
/// of demo files it serves (kept for as long as the gateway runs).
fn load(path: Option<PathBuf>) -> Result<(Config, Option<tempfile::TempDir>), ExitCode> {
    let (source, demo_files) = match path {
        Some(path) => (Source::File(path), None),
        None => match demo::files() {
            Ok(dir) => (Source::embedded(dir.path().to_owned()), Some(dir)),
            Err(e) => {
                complain!("gateway: cannot write the embedded default's files to a temporary folder: {e}");
                return Err(ExitCode::FAILURE);
            }
        },
    };
    match config::load(&source) {
        Ok(c) => Ok((c, demo_files)),
        Err(e) => {
            complain!("gateway: invalid configuration: {e}");
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

fn check(path: Option<PathBuf>) -> ExitCode {
    let config = match load(path) {
        Ok((c, _)) => c,
        Err(code) => return code,
    };
    say!("{}: ok", config.source_name);
    say!("listen {}", config.server.listen);
    if let Some(tls) = &config.server.tls {
        let clients = tls.client_ca.as_ref().map(|ca| format!(", client certificates from {}", ca.display()));
        say!("tls {}{}", tls.cert.display(), clients.unwrap_or_default());
    }
    for r in &config.routes {
        let methods = r.methods.as_ref().map(|m| format!(" methods {m:?}")).unwrap_or_default();
        let access = r.access.as_ref().map(|a| a.describe()).unwrap_or_default();
        let hosts = match &r.hosts[..] {
            [] => "*".to_owned(),
            hosts => hosts.iter().map(|h| h.describe()).collect::<Vec<_>>().join(","),
        };
        let conditions = r.conditions.as_ref().map(|c| c.describe(config::redact_condition));
        let when = conditions.map(|c| format!(" when {c}")).unwrap_or_default();
        let target = r.target.describe(&config.upstreams);
        say!("route {:<16} {hosts:<20} {:<24} {target}{methods}{access}{when}", r.name, r.prefix);
    }
    for name in unused_upstreams(&config) {
        say!("warning: upstream {name} is used by no route");
    }
    for (key, why) in unregistered_methods(&config) {
        say!("warning: {key}: {why}");
    }
    check_discovery(&config);
    ExitCode::SUCCESS
}

/// Routes' methods outside the registry (most likely a typo), each with
/// its key and why: valid, so `check` and the start only say so.
fn unregistered_methods(config: &Config) -> Vec<(String, String)> {
    let listed = config.routes.iter().enumerate().flat_map(|(r, route)| {
        route.methods.iter().flatten().enumerate().map(move |(i, m)| (format!("routes[{r}].methods[{i}]"), m))
    });
    listed.filter_map(|(key, m)| config::unregistered_method(m).map(|why| (key, why))).collect()
}

/// Upstreams no route sends requests to: valid, but most likely a route's
/// `upstream` misspelt or forgotten, so `check` and the start say so.
fn unused_upstreams(config: &Config) -> Vec<&str> {
    let used: std::collections::HashSet<usize> = config
        .routes
        .iter()
        .flat_map(|r| match &r.target {
            // A split's members and a mirror's shadow are used too.
            config::Target::Proxy(p) => {
                let members = p.split.iter().flat_map(|s| s.members.iter().map(|m| m.upstream));
                let shadow = p.mirror.as_ref().map(|m| m.upstream);
                std::iter::once(p.upstream).chain(members).chain(shadow).collect()
            }
            _ => Vec::new(),
        })
        .collect();
    config.upstreams.iter().enumerate().filter(|(i, _)| !used.contains(i)).map(|(_, u)| u.name.as_str()).collect()
}

/// Looks each discovered upstream's name up once and says what it found. A
/// name that does not resolve is no configuration error (the app's Service
/// may come up after the gateway), so this only informs.
fn check_discovery(config: &Config) {
    use crate::discovery::hold::{Combined, Held};
    use crate::discovery::resolve;
    let discovered: Vec<_> = config.upstreams.iter().filter_map(|u| Some((u, u.discover.as_ref()?))).collect();
    if discovered.is_empty() {
        return;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return say!("discovered names not checked: cannot start a runtime: {e}"),
    };
    rt.block_on(async {
        let resolver = match resolve::resolver(&config.resolver) {
            Ok(r) => r,
            Err(e) => return say!("discovered names not checked: {e}"),
        };
        for (u, d) in discovered {
            let what = format!("upstream {}: {} {}", u.name, d.source(), d.describe());
            let looked = tokio::time::timeout(crate::discovery::CHECK_TIMEOUT, resolve::lookup(&resolver, d)).await;
            match looked.map(|answer| Held::default().combine(answer)) {
                Ok(Combined::Found { endpoints, failed, .. }) => {
                    let addresses: Vec<&str> = endpoints.iter().map(|e| e.url.as_str()).collect();
                    let failed = failed.map(|why| format!(" (a part failed: {why})")).unwrap_or_default();
                    say!("{what} resolves to {}{failed}", addresses.join(", "));
                }
                Ok(Combined::NotFound { failed: None }) => say!("{what} is not resolvable now (not found)"),
                Ok(Combined::NotFound { failed: Some(why) }) => {
                    say!("{what} is not resolvable now (not found; a part failed: {why})")
                }
                Ok(Combined::Failed(why)) => say!("{what} is not resolvable now ({why})"),
                Err(_) => say!("{what} is not resolvable now (no answer in time)"),
            }
        }
    });
}

fn runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    match worker_threads {
        // One worker: a single-threaded runtime avoids cross-thread wake-ups.
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
}

/// Resolves on SIGTERM or SIGINT, and cancels `again` on a second one
/// (which ends the drain at once, see `App::cut_drain_short`). The
/// handlers are installed when this is called, not when the future is
/// first polled: the listeners may answer a request before that, and a
/// SIGTERM sent after the answer would find the default action (the
/// process killed, not drained).
fn shutdown_signal(again: CancellationToken) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::warn!("SIGTERM received again: ending the drain now"),
                _ = int.recv() => tracing::warn!("SIGINT received again: ending the drain now"),
            }
            again.cancel();
        });
    }
}

/// Reloads the configuration on every SIGHUP (see `App::reload`).
async fn reload_on_sighup(app: std::sync::Arc<crate::server::App>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload with POST /-/reload on the admin listener");
        return;
    };
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP received: reloading the configuration");
        let _ = app.reload_off_runtime(crate::server::Trigger::Signal).await;
    }
}

fn run_gateway(path: Option<PathBuf>, log_format: LogFormat, watch: bool) -> ExitCode {
    let (mut config, demo_files) = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    config.server.watch_config |= watch;
    for name in unused_upstreams(&config) {
        tracing::warn!(upstream = name, "no route uses this upstream");
    }
    for (key, why) in unregistered_methods(&config) {
        tracing::warn!(key, "{why}");
    }
    let embedded = demo_files.is_some();
    let demo_dir = demo_files.as_ref().map(|d| d.path().display().to_string()).unwrap_or_default();
    // Unset, the access log follows the log format: JSON with JSON logs,
    // the combined format with text ones.
    config.server.access_log_format.get_or_insert(match log_format {
        LogFormat::Json => config::AccessLogFormat::Json,
        LogFormat::Text => config::AccessLogFormat::Combined,
    });
    let rt = match runtime(config.server.worker_threads) {
        Ok(rt) => rt,
        Err(e) => {
            complain!("gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        // Before anything listens: a SIGTERM from then on drains.
        let again = CancellationToken::new();
        let shutdown = shutdown_signal(again.clone());
        let (stop_demo, demo_stopped) = tokio::sync::oneshot::channel::<()>();
        let demo_at = if embedded { demo_address(&config) } else { None };
        if let Some(addr) = demo_at {
            match bind_for(demo::URL_KEY, addr, None).await {
                Ok(l) => {
                    let upstream = demo::Upstream { delay: Duration::from_secs(1), cache_control: None };
                    tokio::spawn(demo::serve(l, upstream, async move {
                        let _ = demo_stopped.await;
                    }));
                }
                Err(e) => {
                    complain!("gateway: the demo upstream: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        let metrics_path = config.metrics.path.clone();
        let tls = config.server.tls.is_some();
        let gateway = match Gateway::bind(config).await {
            Ok(g) => g,
            Err(e) => {
                complain!("gateway: {e}");
                return ExitCode::FAILURE;
            }
        };
        let addr = gateway.local_addr();
        let admin = gateway.admin_addr().unwrap_or(addr);
        tracing::info!(%addr, tls, "gateway listening");
        if let Some(admin) = gateway.admin_addr() {
            // Its own line: with port 0 the bound port is known only here.
            tracing::info!(addr = %admin, "admin listener (metrics, health, status) listening");
        }
        if embedded {
            say!("gateway: running the embedded default configuration on http://{addr}");
            match demo_at {
                Some(at) => say!("  demo upstream (GET /a waits 1s): http://{at}"),
                None => say!("  demo upstream: not started ({} is not a loopback address)", demo::URL_KEY),
            }
            say!("  demo files (carried in the binary): {demo_dir}");
            say!("  try: curl -i http://{addr}/b        # proxied to the upstream's /a");
            say!("       curl -i http://{addr}/file     # a file, with ETag and Range support");
            say!("       curl -i http://{addr}/static/  # a directory tree");
            say!("       curl -i http://{addr}/hello    # a fixed response");
            say!("       curl http://{admin}{metrics_path}   # Prometheus metrics");
        }
        tokio::spawn(reload_on_sighup(gateway.app()));
        let app = gateway.app();
        tokio::spawn(async move {
            again.cancelled().await;
            app.cut_drain_short()
        });
        gateway.serve(shutdown).await;
        let _ = stop_demo.send(());
        ExitCode::SUCCESS
    })
}

/// Where the embedded default's demo upstream listens: the loopback
/// address `upstreams.service_a.url` points at, so that moving the URL
/// (`GATEWAY__UPSTREAMS__SERVICE_A__URL`) moves the demo with it. `None`
/// when the URL points at another machine (a real service A): then no demo
/// is started.
fn demo_address(config: &Config) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    let up = config.upstreams.iter().find(|u| u.name == "service_a")?;
    let addr = match &up.endpoints.first()?.address {
        config::Address::Ip(addr) => *addr,
        config::Address::Tcp(host_port) => host_port.to_socket_addrs().ok()?.next()?,
        config::Address::Unix(_) => return None,
    };
    addr.ip().is_loopback().then_some(addr)
}

fn run_upstream(listen: SocketAddr, upstream: demo::Upstream) -> ExitCode {
    let rt = match runtime(0) {
        Ok(rt) => rt,
        Err(e) => {
            complain!("gateway upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let shutdown = shutdown_signal(CancellationToken::new());
        let listener = match bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                complain!("gateway upstream: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let delay = humantime::format_duration(upstream.delay);
        let cache_control = upstream.cache_control.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("none");
        tracing::info!(addr = %listen, %delay, cache_control, "upstream listening");
        demo::serve(listener, upstream, shutdown).await;
        ExitCode::SUCCESS
    })
}
