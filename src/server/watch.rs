//! `--watch` / `server.watch_config`: the configuration file is loaded
//! again when it changes on disk, as on SIGHUP (same rules, same metrics,
//! counted with `trigger="watch"`; an invalid file changes nothing).
//!
//! The file's folder is watched, not the file: editors save by writing a
//! new file and renaming it over the old one, and a Kubernetes ConfigMap
//! volume swaps a symlink (`..data`) to a new folder, so the file's own
//! inode never changes. Only events that name the file (or its symlink's
//! target), or that leave its path leading to another file (the `..data`
//! swap), count: a log file written next to it every few milliseconds does
//! not. A counted event starts a quiet period (`DEBOUNCE`), bounded by
//! `MAX_DELAY` after its first event so that a file touched without pause
//! is still read; then the file is read twice, `SETTLE` apart, and applied
//! only when both reads agree (a file still being written is not applied
//! half-way, even if its first part parses) and differ from the last bytes
//! applied or tried, so the several events of one save make at most one
//! reload. The reload parses exactly the bytes checked. Without events the
//! file is still compared every `POLL`, so the last state of the file is
//! always the one evaluated: a fix that no event told of (written through
//! another path, a bind mount) is applied after a failed reload too.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{App, Trigger};

/// How long the file must be quiet before it is read.
pub const DEBOUNCE: Duration = Duration::from_millis(250);
/// The longest a change waits after its first event, however often the
/// file is touched: events without pause must not postpone it for ever.
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// How long the bytes read after the quiet period must stay the same before
/// they are applied.
pub const SETTLE: Duration = Duration::from_millis(500);
/// How often a watcher with no event compares the file with the bytes last
/// applied or tried (and checks that the app still runs).
const POLL: Duration = Duration::from_secs(2);

/// Watches `path` for as long as `app` runs.
pub async fn watch(app: Weak<App>, path: PathBuf) {
    // Absolute, as the paths of the folder's events are.
    let path = std::path::absolute(&path).unwrap_or(path);
    // Dropped at the end: it stops watching.
    let Some((_watcher, mut rx)) = start(&path) else { return };
    tracing::info!(file = %path.display(), "watching the configuration file for changes");
    let mut seen = tokio::fs::read(&path).await.ok();
    // A change is still to be read, without waiting for another event.
    let mut due = false;
    loop {
        if !due {
            match tokio::time::timeout(POLL, rx.recv()).await {
                Ok(Some(())) => {}
                Ok(None) => return,
                Err(_) if app.strong_count() == 0 => return,
                // No event: the bytes are compared all the same, so that a
                // change no event told of (a fix written through another
                // path after a failed reload) is what ends up applied.
                Err(_) if tokio::fs::read(&path).await.ok() != seen => {}
                Err(_) => continue,
            }
        }
        due = false;
        if !settle(&mut rx, Instant::now()).await {
            return;
        }
        let now = match read_settled(&path).await {
            Read::Settled(now) => now,
            Read::Moving => {
                due = true;
                continue;
            }
            Read::Unreadable => {
                tracing::debug!(file = %path.display(), "configuration file unreadable after a change; waiting for the next");
                continue;
            }
        };
        if seen.as_ref() == Some(&now) {
            continue;
        }
        let Some(app) = app.upgrade() else { return };
        tracing::info!(file = %path.display(), "configuration file changed: reloading");
        // Exactly the bytes checked; not UTF-8, the file is read again
        // for the reload to say why it fails.
        let text = String::from_utf8(now.clone()).ok();
        seen = Some(now);
        // Logged and counted by the reload, either way.
        let _ = tokio::task::spawn_blocking(move || app.reload_from(Trigger::Watch, text.as_deref())).await;
    }
}

/// The watcher on the file's folders, and the channel its relevant events
/// arrive on.
fn start(path: &Path) -> Option<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let concern = Concern::new(path);
    let mut watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // An error may mean events were lost: read the file to be sure.
        if event.as_ref().map_or(true, |e| concern.matters(e)) {
            let _ = tx.send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the configuration file; reload with SIGHUP");
            return None;
        }
    };
    for dir in folders(path) {
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(folder = %dir.display(), error = %e, "cannot watch the configuration's folder");
        }
    }
    Some((watcher, rx))
}

/// What reading a file that has just been quiet gave.
enum Read {
    /// The same bytes twice, `SETTLE` apart.
    Settled(Vec<u8>),
    /// Different bytes: still being written.
    Moving,
    /// Missing or unreadable (being replaced: its arrival is an event).
    Unreadable,
}

/// Reads the file twice, `SETTLE` apart: a writer that pauses between its
/// steps (a `cat > file`, an editor writing in place) for less than the
/// debounce and `SETTLE` together is never read half-way, even when what
/// it wrote so far parses; and a change whose events were missed (written
/// through another path, a bind mount) is caught by the second read.
async fn read_settled(path: &Path) -> Read {
    let Ok(first) = tokio::fs::read(path).await else { return Read::Unreadable };
    tokio::time::sleep(SETTLE).await;
    match tokio::fs::read(path).await {
        Ok(second) if second == first => Read::Settled(second),
        Ok(_) => Read::Moving,
        Err(_) => Read::Unreadable,
    }
}

/// The rest of a save (or swap) that started at `first`: returns once no
/// event came for `DEBOUNCE`, or `MAX_DELAY` after `first`; false when the
/// watcher is gone.
async fn settle(rx: &mut mpsc::UnboundedReceiver<()>, first: Instant) -> bool {
    let bound = first + MAX_DELAY;
    loop {
        let now = Instant::now();
        if now >= bound {
            return true;
        }
        match tokio::time::timeout_at((now + DEBOUNCE).min(bound), rx.recv()).await {
            Ok(Some(())) => continue,
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}

/// Which of the watched folders' events concern the configuration file.
struct Concern {
    /// The file's absolute path.
    path: PathBuf,
    /// Where it led at the last look (through any symlinks).
    target: Mutex<Option<PathBuf>>,
}

impl Concern {
    fn new(path: &Path) -> Concern {
        Concern { path: path.to_owned(), target: Mutex::new(std::fs::canonicalize(path).ok()) }
    }

    /// Not reads (the reload's own read of the file would start the next
    /// round); an event that names the file or its target; or a rename,
    /// creation or removal after which the path leads elsewhere. Writes to
    /// other files cannot move the path, so they cost no lookup.
    fn matters(&self, event: &notify::Event) -> bool {
        if event.kind.is_access() {
            return false;
        }
        if event.need_rescan() {
            return true;
        }
        let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        if event.paths.iter().any(|p| *p == self.path || Some(p) == target.as_ref()) {
            return true;
        }
        if matches!(event.kind, EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Metadata(_))) {
            return false;
        }
        let now = std::fs::canonicalize(&self.path).ok();
        if now == *target {
            return false;
        }
        *target = now;
        true
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
