//! `Upstream::choose` runs for every request to an upstream with several
//! endpoints: it picks one without a heap allocation (up to 16 endpoints;
//! past that, one list a pick). This binary's allocator counts the
//! allocations made on each thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use gateway::body::ReadAhead;
use gateway::config::{Source, load};
use gateway::upstream::Upstream;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting the allocations made on each thread.
struct CountingPerThread;

fn count() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

unsafe impl GlobalAlloc for CountingPerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CountingPerThread = CountingPerThread;

fn upstream(balance: &str, endpoints: &str) -> Upstream {
    let text = format!("[upstreams.u]\nendpoints = {endpoints}\nbalance = \"{balance}\"\n");
    let config = load(&Source::Inline { text, base_dir: std::env::temp_dir() }).unwrap();
    let u = config.upstreams.into_iter().find(|u| u.name == "u").unwrap();
    Upstream::new(u, true, Arc::new(ReadAhead::new(1024)), None)
}

fn urls(ports: std::ops::RangeInclusive<u16>) -> String {
    let urls: Vec<String> = ports.map(|p| format!("\"http://127.0.0.1:{p}\"")).collect();
    format!("[{}]", urls.join(", "))
}

#[tokio::test]
async fn choosing_among_endpoints_allocates_nothing() {
    let weighted = "[{ url = \"http://127.0.0.1:1\", weight = 3 }, \"http://127.0.0.1:2\"]".to_owned();
    // (endpoints, how many, allocations over the three picks below)
    let cases =
        [(urls(1..=2), 2, 0), (urls(1..=3), 3, 0), (weighted, 2, 0), (urls(1..=16), 16, 0), (urls(1..=17), 17, 3)];
    for (endpoints, n, want) in &cases {
        for balance in ["round_robin", "least_request"] {
            let up = upstream(balance, endpoints);
            let before = ALLOCATIONS.with(Cell::get);
            // A first attempt, then retries with some endpoints tried.
            for tried in [&[][..], &[0], &[0, 1]] {
                let (index, attempt) = up.choose(tried).unwrap();
                let fresh = tried.len() < *n;
                assert!(!(fresh && tried.contains(&index)), "{balance} over {endpoints}: {index} again");
                drop(attempt);
            }
            let made = ALLOCATIONS.with(Cell::get) - before;
            assert_eq!(made, *want, "{balance} over {endpoints}");
        }
    }
}
