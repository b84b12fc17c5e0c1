//! Opening a route's file: the path resolved and kept under the root, the
//! descriptor checked again once opened.

use std::path::{Path, PathBuf};

use crate::error::GatewayError;

/// Resolves symlinks and refuses anything that ends up outside `root`
/// (which is already canonical).
pub(super) async fn resolve(root: &Path, path: &Path) -> Result<PathBuf, GatewayError> {
    let real = tokio::fs::canonicalize(path).await.map_err(not_found_or_io)?;
    if real.starts_with(root) { Ok(real) } else { Err(GatewayError::NotFound) }
}

/// Opens the file at `path` and stats the descriptor. Under a `root`, the
/// file opened must lie in it, by the path the kernel gives the descriptor:
/// `resolve` checked the path, but a directory on it swapped for a symlink
/// since would lead the open outside.
pub(super) fn open(path: &Path, root: Option<&Path>) -> Result<(std::fs::File, std::fs::Metadata), GatewayError> {
    use std::os::unix::fs::OpenOptionsExt;
    // Blocking, as the stat in `serve`: the path was just looked up. Not
    // waiting: a FIFO put there since would hold the worker until a writer
    // came (a regular file's reads ignore the flag).
    let file =
        std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(not_found_or_io)?;
    if let Some(root) = root {
        use std::os::fd::AsRawFd;
        match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            Ok(real) if real.starts_with(root) => {}
            // Without /proc (not Linux, or not mounted) the check before
            // the open is the only one.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Outside, or a path the kernel will not give (one past
            // PATH_MAX): refused.
            _ => return Err(GatewayError::NotFound),
        }
    }
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(GatewayError::NotFound);
    }
    Ok((file, meta))
}

pub(super) fn not_found_or_io(e: std::io::Error) -> GatewayError {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory | std::io::ErrorKind::PermissionDenied => {
            GatewayError::NotFound
        }
        // A name too long, or a symlink loop on the path (a tree that holds
        // one is the client's to walk into; no failure of the gateway's).
        _ if matches!(e.raw_os_error(), Some(libc::ENAMETOOLONG | libc::ELOOP)) => GatewayError::NotFound,
        _ => GatewayError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state a request meets when a directory on its checked path was
    /// swapped for a symlink that leads out of the root: the open refuses it.
    #[test]
    fn a_file_opened_outside_the_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(root.join("real/f.txt"), "inside").unwrap();
        std::fs::write(dir.path().join("outside/f.txt"), "outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), root.join("swapped")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("inner")).unwrap();
        let root = root.canonicalize().unwrap();
        assert!(open(&root.join("real/f.txt"), Some(&root)).is_ok());
        assert!(open(&root.join("inner/f.txt"), Some(&root)).is_ok(), "a symlink kept inside is followed");
        let out = open(&root.join("swapped/f.txt"), Some(&root));
        assert!(matches!(out, Err(GatewayError::NotFound)), "{:?}", out.map(|_| ()));
        // A `file` route's own path has no root to stay in.
        assert!(open(&root.join("swapped/f.txt"), None).is_ok());
    }

    /// Outside by a path the kernel will not give (past PATH_MAX): refused,
    /// not let through unchecked.
    #[test]
    fn a_file_whose_path_cannot_be_read_back_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let half = vec!["d".repeat(200); 11].join("/");
        std::fs::create_dir_all(dir.path().join(&half)).unwrap();
        std::os::unix::fs::symlink(dir.path().join(&half), dir.path().join("s1")).unwrap();
        std::fs::create_dir_all(dir.path().join("s1").join(&half)).unwrap();
        std::fs::write(dir.path().join("s1").join(&half).join("f.txt"), "deep outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("s1").join(&half), root.join("deep")).unwrap();
        let root = root.canonicalize().unwrap();
        assert!(open(&root.join("deep/f.txt"), None).is_ok(), "the file is there");
        let out = open(&root.join("deep/f.txt"), Some(&root));
        assert!(matches!(out, Err(GatewayError::NotFound)), "{:?}", out.map(|_| ()));
    }

    /// A FIFO where a file was: refused at once, the worker not held
    /// until a writer comes.
    #[test]
    fn a_fifo_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f.bin");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(open(&fifo, None).map(|_| ()));
        });
        let opened = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the open waited for a writer");
        assert!(matches!(opened, Err(GatewayError::NotFound)), "{opened:?}");
    }
}
