//! Reloads that change the routing while clients (HTTP/1.1 and HTTP/2)
//! send a steady stream: no request is lost, none started after a reload
//! reaches an upstream the new file removed or no longer routes to, and
//! the requests under way at the reload finish where they started.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{TestBody, TestGateway, TestUpstream, full};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Mutex;

/// An upstream answering its name, a little later (so requests are under
/// way at each reload).
async fn naming(name: &'static str) -> TestUpstream {
    TestUpstream::start(move |_req: Request<hyper::body::Incoming>| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Response::new(full(name))
    })
    .await
}

fn upstream(name: &str, up: &TestUpstream) -> String {
    format!("[upstreams.{name}]\nurl = \"http://{}\"\n", up.addr)
}

/// Step 0: api.example.com's /api split over a and b. Step 1: a is gone
/// from the file, /api splits over b and c, and a new host has its own
/// route. Step 2: /api goes to c alone, b is gone too.
fn file(step: usize, ups: &[TestUpstream; 3]) -> String {
    let [a, b, c] = ups;
    let routes = |api: &str, web: &str| {
        format!(
            "[[routes]]\nname = \"api\"\nprefix = \"/api\"\nhosts = [\"api.example.com\"]\n{api}\n\
             [[routes]]\nname = \"web\"\nprefix = \"/\"\nupstream = \"{web}\"\n"
        )
    };
    match step {
        0 => format!(
            "{}{}{}{}",
            upstream("a", a),
            upstream("b", b),
            upstream("c", c),
            routes("split = [{ upstream = \"a\", weight = 50 }, { upstream = \"b\", weight = 50 }]", "b")
        ),
        1 => format!(
            "{}{}{}[[routes]]\nname = \"new-host\"\nprefix = \"/\"\nhosts = [\"new.example.com\"]\nupstream = \"c\"\n",
            upstream("b", b),
            upstream("c", c),
            routes("split = [{ upstream = \"b\", weight = 20 }, { upstream = \"c\", weight = 80 }]", "b")
        ),
        _ => format!("{}{}", upstream("c", c), routes("upstream = \"c\"", "c")),
    }
}

/// What each client saw: the step the gateway was at (at least) when the
/// request was sent, and the answer's status and body.
type Seen = Arc<Mutex<Vec<(usize, u16, String)>>>;

/// A client: HTTP/1.1 with `Host`, or HTTP/2 with `:authority`.
enum Sender {
    H1(Box<Client<hyper_util::client::legacy::connect::HttpConnector, TestBody>>, String),
    H2(hyper::client::conn::http2::SendRequest<TestBody>),
}

impl Sender {
    async fn new(http2: bool, gw: &str) -> Sender {
        match http2 {
            false => {
                Sender::H1(Box::new(Client::builder(TokioExecutor::new()).build_http()), format!("http://{gw}/api/x"))
            }
            true => Sender::H2(common::h2_client(gw.parse().unwrap()).await.0),
        }
    }

    /// `GET /api/x` on api.example.com: the status and body, or 0 and why.
    async fn get(&mut self) -> (u16, String) {
        let answer = match self {
            Sender::H1(client, url) => {
                let req = Request::get(&*url).header("host", "api.example.com").body(full(Bytes::new())).unwrap();
                client.request(req).await.map_err(|e| e.to_string())
            }
            Sender::H2(sender) => {
                let req = Request::get("http://api.example.com/api/x").body(full(Bytes::new())).unwrap();
                sender.send_request(req).await.map_err(|e| e.to_string())
            }
        };
        match answer {
            Ok(r) => {
                let status = r.status().as_u16();
                let body = r.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
            Err(e) => (0, e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_that_change_routing_under_load_lose_no_request_and_leave_removed_upstreams() {
    let ups = [naming("a").await, naming("b").await, naming("c").await];
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::from_file(dir.path(), &file(0, &ups)).await;
    let (stop, step, seen): (_, _, Seen) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Seen::default());
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (stop, step, seen, addr) = (stop.clone(), step.clone(), seen.clone(), gw.addr.to_string());
            tokio::spawn(async move {
                let mut sender = Sender::new(i % 2 == 1, &addr).await;
                while !stop.load(Ordering::SeqCst) {
                    let at = step.load(Ordering::SeqCst);
                    let (status, body) = sender.get().await;
                    seen.lock().await.push((at, status, body));
                }
            })
        })
        .collect();
    for next in 1..=2 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(dir.path().join("gateway.toml"), file(next, &ups)).unwrap();
        gw.app.reload().expect("a valid file reloads");
        step.store(next, Ordering::SeqCst);
        if next == 1 {
            let req = Request::get(gw.url("/")).header("host", "new.example.com").body(full(Bytes::new())).unwrap();
            assert_eq!(&common::send(req).await.1[..], b"c", "the new host's route serves at once");
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    let seen = seen.lock().await;
    let lost: Vec<_> = seen.iter().filter(|(_, status, _)| *status != 200).collect();
    assert!(lost.is_empty(), "no request may fail across a reload: {lost:?}");
    // A request sent at a step may be routed by that step's file or a
    // later one (a reload may land while it is on its way in), never an
    // earlier one.
    let allowed = |step: usize| -> &[&str] {
        match step {
            0 => &["a", "b", "c"],
            1 => &["b", "c"],
            _ => &["c"],
        }
    };
    for (step, _, body) in seen.iter() {
        assert!(allowed(*step).contains(&body.as_str()), "sent at step {step}, answered by {body}");
    }
    for step in 0..=2 {
        let n = seen.iter().filter(|(s, _, _)| *s == step).count();
        assert!(n > 20, "the load ran at step {step}: {n}");
    }
    for (step, name) in [(0, "a"), (1, "b"), (1, "c"), (2, "c")] {
        assert!(seen.iter().any(|(s, _, b)| *s == step && b == name), "step {step} reached {name}");
    }
}
