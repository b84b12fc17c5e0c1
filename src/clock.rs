//! The wall clock as answers' `Date` field shows it.

use std::time::{Duration, SystemTime};

use rustix::time::{ClockId, clock_gettime};

/// Now by the kernel's coarse wall clock: the time of its last tick, a few
/// milliseconds behind the precise clock at most, and several times
/// cheaper to read than `SystemTime::now()`. The own connections' `Date`
/// field comes from it, so a time that must not run ahead of that field
/// (a `Last-Modified`, RFC 9110 §8.8.2.1) is bounded by it too.
pub fn coarse_now() -> SystemTime {
    let t = clock_gettime(ClockId::RealtimeCoarse);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), nanos)
}

/// The whole seconds of [`coarse_now`] since the Unix epoch.
pub fn coarse_seconds() -> u64 {
    u64::try_from(clock_gettime(ClockId::RealtimeCoarse).tv_sec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coarse clock is never ahead of the precise one, and at most a
    /// tick (well under a second) behind it.
    #[test]
    fn the_coarse_clock_trails_the_precise_one_by_less_than_a_second() {
        for _ in 0..1000 {
            let coarse = coarse_now();
            let precise = SystemTime::now();
            let behind = precise.duration_since(coarse).expect("the coarse clock is not ahead");
            assert!(behind < Duration::from_secs(1), "{behind:?}");
            assert!(coarse_seconds() >= coarse.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs());
        }
    }
}
