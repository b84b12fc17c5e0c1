//! `--watch` / `server.watch_config`: the configuration file is loaded
//! again when it changes on disk, as on SIGHUP (same rules, same metrics,
//! counted with `trigger="watch"`; an invalid file changes nothing).
//!
//! The file's folder is watched, not the file: editors save by writing a
//! new file and renaming it over the old one, and a Kubernetes ConfigMap
//! volume swaps a symlink (`..data`) to a new folder, so the file's own
//! inode never changes. Any event in the folder starts a quiet period
//! (`DEBOUNCE`); after it, the file is read and reloaded only if its bytes
//! differ from the last seen, so other files in the folder and the several
//! events of one save make at most one reload.

use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{App, Trigger};

/// How long the folder must be quiet before the file is read.
pub const DEBOUNCE: Duration = Duration::from_millis(250);
/// How often a watcher with nothing to do checks that the app still runs.
const ALIVE_CHECK: Duration = Duration::from_secs(5);

/// Watches `path` for as long as `app` runs.
pub async fn watch(app: Weak<App>, path: PathBuf) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Not reads: the reload's own read of the file would start the
        // next round.
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => return tracing::warn!(error = %e, "cannot watch the configuration file; reload with SIGHUP"),
    };
    for dir in folders(&path) {
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(folder = %dir.display(), error = %e, "cannot watch the configuration's folder");
        }
    }
    tracing::info!(file = %path.display(), "watching the configuration file for changes");
    let mut seen = tokio::fs::read(&path).await.ok();
    loop {
        match tokio::time::timeout(ALIVE_CHECK, rx.recv()).await {
            Ok(Some(())) => {}
            Ok(None) => return,
            Err(_) if app.strong_count() == 0 => return,
            Err(_) => continue,
        }
        // The rest of this save (or swap): until the folder is quiet.
        loop {
            match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let Ok(now) = tokio::fs::read(&path).await else {
            tracing::debug!(file = %path.display(), "configuration file unreadable after a change; waiting for the next");
            continue;
        };
        if seen.as_ref() == Some(&now) {
            continue;
        }
        seen = Some(now);
        let Some(app) = app.upgrade() else { return };
        tracing::info!(file = %path.display(), "configuration file changed: reloading");
        // Logged and counted by the reload, either way.
        let _ = app.reload_off_runtime(Trigger::Watch).await;
    }
}

/// The file's folder, and its real file's folder when the path is a
/// symlink into another one (edited there, not through the link).
fn folders(path: &Path) -> Vec<PathBuf> {
    let parent = |p: &Path| {
        p.parent().filter(|d| !d.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    let mut dirs = vec![parent(path)];
    if let Ok(real) = std::fs::canonicalize(path) {
        let real_dir = parent(&real);
        let own = std::fs::canonicalize(&dirs[0]).unwrap_or_else(|_| dirs[0].clone());
        // A ConfigMap's real folder is replaced at each update: its own
        // folder's `..data` swap is what tells.
        let swapped = real_dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".."));
        if real_dir != own && !swapped {
            dirs.push(real_dir);
        }
    }
    dirs
}
