//! An upstream that answers each request head with bytes a test scripts
//! (pieces, each after a pause, then whether it closes), for upstreams
//! that lie or break HTTP/1.1 on purpose; and a gateway with one route to it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{TestGateway, raw_upstream};

/// One answer: pieces, each after a pause, then whether the connection is
/// closed.
#[derive(Clone, Default)]
pub struct Answer {
    pub pieces: Vec<(Duration, Vec<u8>)>,
    pub close: bool,
}

/// `bytes` at once, the connection left open.
pub fn answer(bytes: &[u8]) -> Answer {
    Answer { pieces: vec![(Duration::ZERO, bytes.to_vec())], close: false }
}

/// `a`, then `bytes` after `pause_ms`.
pub fn then(mut a: Answer, pause_ms: u64, bytes: &[u8]) -> Answer {
    a.pieces.push((Duration::from_millis(pause_ms), bytes.to_vec()));
    a
}

/// An upstream that reads request heads (it ignores request bodies: use it
/// for bodiless requests) and answers each with `script(connection,
/// request on it, the request head)`. Counts the connections accepted.
pub async fn scripted<F>(script: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(usize, usize, &str) -> Answer + Send + Sync + 'static,
{
    let script = Arc::new(script);
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let addr = raw_upstream(move |mut s| {
        let index = a.fetch_add(1, Ordering::SeqCst);
        let script = script.clone();
        async move {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            let mut n_req = 0;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
                    got.drain(..end + 4);
                    let answer = script(index, n_req, &head);
                    n_req += 1;
                    for (pause, piece) in &answer.pieces {
                        tokio::time::sleep(*pause).await;
                        if s.write_all(piece).await.is_err() {
                            return;
                        }
                    }
                    if answer.close {
                        return;
                    }
                }
            }
        }
    })
    .await;
    (addr, accepted)
}

/// A gateway with one route, `/h`, to an upstream named `name` (the
/// metrics are the test process's: each test has its own name), with
/// `extra` route keys.
pub async fn route_to(addr: SocketAddr, name: &str, extra: &str) -> TestGateway {
    TestGateway::from_toml(&format!(
        "[upstreams.{name}]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"{name}\"\nprefix = \"/h\"\nupstream = \"{name}\"\n{extra}\n"
    ))
    .await
}
