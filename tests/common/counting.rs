//! A global allocator that counts the bytes live on the heap of the test
//! binary that installs it (the gateway runs in it), so that a test can
//! tell what the gateway really holds. A test file installs it with
//! `#[global_allocator] static ALLOC: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting into [`LIVE`].
pub struct Counting;

/// The bytes live on the heap, where [`Counting`] is the global allocator.
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What the heap grew by over `requests` GETs of `{base}0`, `{base}1`, …
/// on one client connection, each with `header` if given: first `warm`
/// GETs of `{base}warm0`, … fill the pools and buffers, and the heap is
/// read 200 ms after each run, once the connections are quiet. Every
/// answer must be a 200.
pub async fn heap_growth(base: &str, header: Option<(&str, &str)>, warm: usize, requests: usize) -> isize {
    use http_body_util::BodyExt;
    let c = super::client();
    let get = |path: String| {
        let mut req = http::Request::get(format!("{base}{path}"));
        if let Some((name, value)) = header {
            req = req.header(name, value);
        }
        let req = req.body(super::full(bytes::Bytes::new())).unwrap();
        let c = c.clone();
        async move {
            let resp = c.request(req).await.unwrap();
            assert_eq!(resp.status(), 200, "{base}{path}");
            resp.into_body().collect().await.unwrap();
        }
    };
    for i in 0..warm {
        get(format!("warm{i}")).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..requests {
        get(i.to_string()).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    LIVE.load(Ordering::Relaxed) - before
}
