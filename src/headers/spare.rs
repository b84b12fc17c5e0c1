//! Header maps handed back by messages the gateway is done with, for the
//! next head it parses on the same thread: a map is two allocations (its
//! index and its entries), and a proxied request makes two (the request's,
//! the upstream response's), hyper's server one more of its own. hyper's
//! server keeps one map per connection for the same reason; here a few are
//! kept per thread, so an idle connection holds none.

use std::cell::RefCell;

use http::HeaderMap;

/// Maps kept per thread at most: enough for the requests a worker
/// interleaves between a map's return and its next use.
const KEPT: usize = 4;

/// A map with more room than this is dropped, not kept: one head with
/// hundreds of fields does not stay in the thread's memory.
const ROOM: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `n` fields: a spare one if the thread has
/// one, else a new one.
pub fn map_with_room(n: usize) -> HeaderMap {
    match SPARE.with_borrow_mut(Vec::pop) {
        Some(mut map) => {
            map.reserve(n);
            map
        }
        None => HeaderMap::with_capacity(n),
    }
}

/// `map`, its fields dropped, kept for [`map_with_room`] (if there is room
/// for it and it is not too large).
pub fn give_back(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > ROOM {
        return;
    }
    map.clear();
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < KEPT {
            spare.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HOST, HeaderValue};

    /// A map given back comes back empty, with its room; one too large is
    /// not kept, nor more than `KEPT`.
    #[test]
    fn a_map_given_back_is_reused_empty() {
        std::thread::spawn(|| {
            let mut map = HeaderMap::with_capacity(20);
            map.insert(HOST, HeaderValue::from_static("x"));
            let room = map.capacity();
            give_back(map);
            let again = map_with_room(4);
            assert!(again.is_empty());
            assert_eq!(again.capacity(), room, "the same map, not a new one");
            give_back(HeaderMap::with_capacity(ROOM * 2));
            assert_eq!(
                map_with_room(4).capacity(),
                HeaderMap::<HeaderValue>::with_capacity(4).capacity(),
                "too large to keep"
            );
            for _ in 0..KEPT + 2 {
                give_back(HeaderMap::with_capacity(20));
            }
            assert_eq!(SPARE.with_borrow(Vec::len), KEPT);
            let grown = map_with_room(ROOM);
            assert!(grown.capacity() >= ROOM, "room is made for what is asked");
        })
        .join()
        .unwrap();
    }
}
