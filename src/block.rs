//! Short byte strings copied into a per-thread block rather than allocated
//! one by one: a request ID, a `traceparent` and a rewritten path are made
//! on every request that has them, and `Bytes::from(Vec)` or
//! `Bytes::from_owner` cost an allocation and a free each (see
//! benches/README.md, Decisions), where a cut from the block costs a
//! reference count. A block is freed when the last copy cut from it is
//! dropped, so one long request (a long poll, a slow upstream) keeps its
//! block, 512 bytes, alive after the short ones that shared it are gone:
//! small blocks bound that, at one allocation per few requests.

use bytes::{Bytes, BytesMut};

/// The bytes of a block; a longer copy gets one of its own length.
const BLOCK: usize = 512;

thread_local! {
    static LEFT: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::with_capacity(BLOCK));
}

/// `pieces`, one after the other, as one `Bytes` whose clones share it
/// without allocating.
pub fn copy_of<const N: usize>(pieces: [&[u8]; N]) -> Bytes {
    let len = pieces.iter().map(|p| p.len()).sum();
    let fill = |buf: &mut BytesMut| pieces.iter().for_each(|piece| buf.extend_from_slice(piece));
    if len > BLOCK {
        let mut own = BytesMut::with_capacity(len);
        fill(&mut own);
        return own.freeze();
    }
    LEFT.with_borrow_mut(|left| {
        // This block again if nothing cut from it is held any more, else a
        // new one (never a larger one: `reserve` would keep the size of
        // the largest seen).
        if !left.try_reclaim(len) {
            *left = BytesMut::with_capacity(BLOCK);
        }
        fill(left);
        left.split().freeze()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies are exact and joined, whatever their length (one longer than
    /// a block gets its own), share nothing with the caller's bytes, and
    /// are untouched by the copies cut after them.
    #[test]
    fn copies_are_exact_and_apart() {
        let long = "v".repeat(5000);
        let mut kept = Vec::new();
        for round in 0..200 {
            for pieces in [&["/hello", "", "", "?", "a=1"][..], &[""], &["0af7651916cd43dd"], &[long.as_str(), "/x"]] {
                let sources: Vec<Bytes> = pieces.iter().map(|p| Bytes::from(p.to_string())).collect();
                let mut refs = [&b""[..]; 5];
                sources.iter().zip(&mut refs).for_each(|(s, r)| *r = &s[..]);
                let copy = copy_of(refs);
                assert_eq!(copy, pieces.concat().as_bytes(), "round {round}");
                // (An empty `Bytes` is static, never unique.)
                assert!(
                    sources.into_iter().all(|s| s.is_empty() || s.is_unique()),
                    "the copy shares the caller's bytes"
                );
                kept.push((copy, pieces.concat()));
            }
        }
        assert!(kept.iter().all(|(copy, want)| copy == want.as_bytes()));
    }

    /// A block is taken back once nothing cut from it is held, and left to
    /// its holders while something is: what they hold is untouched.
    #[test]
    fn a_block_is_reused_only_once_free() {
        std::thread::spawn(|| {
            let piece = [7u8; 100];
            let first = copy_of([&piece]);
            let rest: Vec<Bytes> = (0..4).map(|_| copy_of([&piece])).collect();
            // 12 bytes left: the next copy needs a block, and the first is held.
            let held = copy_of([&piece]);
            assert_ne!(held.as_ptr(), first.as_ptr());
            assert!(rest.iter().chain([&first, &held]).all(|b| b[..] == piece[..]));
            let at = held.as_ptr();
            drop((first, rest, held));
            // The second block's 412 bytes down to 12, then dropped: the
            // next copy takes it back.
            let more: Vec<Bytes> = (0..4).map(|_| copy_of([&piece])).collect();
            drop(more);
            assert_eq!(copy_of([&piece]).as_ptr(), at, "a free block was not taken back");
        })
        .join()
        .unwrap();
    }
}
