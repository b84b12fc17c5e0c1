//! `gateway`: a reverse-proxy gateway that runs as a sidecar in front of a
//! slow service. It forwards requests to configured upstreams through a
//! pooled keep-alive client, serves files with async reads, bounds each route
//! with its own timeout, and exposes Prometheus metrics.
//!
//! The data path is [`server::App::handle`]; [`run`] wires a validated
//! [`config::Config`] to listeners and signals.
#![forbid(unsafe_code)]

pub mod body;
pub mod cli;
pub mod config;
pub mod error;
pub mod files;
pub mod headers;
pub mod limits;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod router;
pub mod server;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::server::App;

/// A gateway with its listeners bound, ready to serve.
pub struct Gateway {
    app: Arc<App>,
    listener: TcpListener,
    admin: Option<TcpListener>,
}

impl Gateway {
    /// Binds the main listener (and the admin listener, if configured).
    pub async fn bind(config: Config) -> std::io::Result<Gateway> {
        let listener = bind(config.server.listen).await?;
        let admin = match config.metrics.listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Gateway { app: Arc::new(App::new(config)), listener, admin })
    }

    /// The main listener's address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    /// The admin listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|l| l.local_addr().expect("bound listener has an address"))
    }

    /// Serves until `shutdown` resolves, then drains (see [`server::serve`]).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        crate::metrics::install().spawn_upkeep();
        let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        if let Some(admin) = self.admin {
            tokio::spawn(server::serve_admin(admin, self.app.clone(), async move {
                let _ = admin_stopped.await;
            }));
        }
        server::serve(self.listener, self.app, shutdown).await;
        let _ = stop_admin.send(());
    }
}

/// Accepts the next connection. On errors such as EMFILE it logs and backs
/// off for a moment instead of spinning.
pub async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Binds a TCP listener with a backlog large enough for load tests
/// (std's default of 128 drops connections under bursts).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}
