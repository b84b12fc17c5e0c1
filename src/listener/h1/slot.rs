//! Boxes for the app's future, kept per thread between exchanges: the
//! future is several KiB, too large for the allocator's per-thread cache,
//! so a new box per request costs a slow allocation and free. hyper's
//! server connection keeps its box for the connection's life; here a few
//! are kept per thread, empty, so an idle connection holds none.

use std::any::Any;
use std::cell::RefCell;
use std::pin::Pin;

/// The box a future of type `F` runs in.
pub type Slot<F> = Pin<Box<Option<F>>>;

/// Boxes kept per thread at most: enough for the answers a worker has in
/// flight at once under load, without keeping a burst's worth.
const KEPT: usize = 32;

/// The kept boxes: each entry an `Option<Slot<F>>` (type-erased, as a
/// thread-local's type must be named; one `F` is ever kept, the app's
/// future), those before `filled` holding one.
struct Spare {
    boxes: Vec<Box<dyn Any>>,
    filled: usize,
}

thread_local! {
    static SPARE: RefCell<Spare> = const { RefCell::new(Spare { boxes: Vec::new(), filled: 0 }) };
}

/// An empty box for an `F`: a kept one if the thread has one, else a new one.
pub fn take<F: 'static>() -> Slot<F> {
    let kept = SPARE.with_borrow_mut(|spare| {
        let at = spare.filled.checked_sub(1)?;
        let slot = spare.boxes[at].downcast_mut::<Option<Slot<F>>>()?.take();
        spare.filled = at;
        slot
    });
    kept.unwrap_or_else(|| Box::pin(None))
}

/// `slot`, its future dropped, kept for [`take`] if there is room.
pub fn give_back<F: 'static>(mut slot: Slot<F>) {
    slot.set(None);
    SPARE.with_borrow_mut(|spare| {
        if spare.filled == spare.boxes.len() {
            if spare.boxes.len() >= KEPT {
                return;
            }
            spare.boxes.push(Box::new(None::<Slot<F>>));
        }
        if let Some(entry) = spare.boxes[spare.filled].downcast_mut::<Option<Slot<F>>>() {
            *entry = Some(slot);
            spare.filled += 1;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The address of the box inside a slot, to tell boxes apart.
    fn addr<F>(slot: &Slot<F>) -> *const Option<F> {
        &**slot
    }

    /// A box given back is taken again, empty; its future was dropped
    /// when it was given back; no more than `KEPT` are kept.
    #[test]
    fn a_slot_given_back_is_reused_empty() {
        std::thread::spawn(|| {
            let held = Arc::new(());
            let mut slot = take::<Arc<()>>();
            slot.set(Some(held.clone()));
            let first = addr(&slot);
            give_back(slot);
            assert_eq!(Arc::strong_count(&held), 1, "the future is dropped when given back");
            let again = take::<Arc<()>>();
            assert_eq!(addr(&again), first, "the box is reused");
            assert!(again.is_none());
            give_back(again);

            let slots: Vec<_> = (0..KEPT + 2).map(|_| take::<Arc<()>>()).collect();
            assert_eq!(slots.iter().filter(|s| addr(s) == first).count(), 1);
            slots.into_iter().for_each(give_back);
            assert_eq!(SPARE.with_borrow(|s| s.filled), KEPT);
            let other = take::<u64>();
            assert!(other.is_none(), "a slot of another type is a new one");
            assert_eq!(SPARE.with_borrow(|s| s.filled), KEPT);
        })
        .join()
        .unwrap();
    }
}
