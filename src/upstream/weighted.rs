//! Balancing over endpoints of unequal `weight`: pure, table-tested. With
//! equal weights `endpoint::pick` keeps its unweighted ways.

use super::endpoint::Candidate;

/// Round robin: the counter walks a wheel where each endpoint holds as many
/// places as its weight (so runs of one endpoint, in proportion); from the
/// place it lands on, the first eligible endpoint.
pub fn round_robin(endpoints: &[Candidate], eligible: impl Fn(&Candidate) -> bool, next: usize) -> Option<usize> {
    let total: u64 = endpoints.iter().map(|e| u64::from(e.weight)).sum();
    let mut place = (next as u64) % total.max(1);
    let start = endpoints
        .iter()
        .position(|e| {
            let inside = place < u64::from(e.weight);
            place = place.saturating_sub(u64::from(e.weight));
            inside
        })
        .unwrap_or(0);
    let n = endpoints.len();
    (0..n).map(|k| (start + k) % n).find(|&i| eligible(&endpoints[i]))
}

/// Least request: two distinct endpoints drawn with chances in proportion
/// to their weights; of the two, the one with fewer requests in flight for
/// its weight. `random(n)` gives a number below `n`.
pub fn least_request(
    endpoints: &[Candidate],
    eligible: impl Fn(&Candidate) -> bool,
    mut random: impl FnMut(usize) -> usize,
) -> Option<usize> {
    let draw = |skip: Option<usize>, at: usize| {
        let mut left = at;
        endpoints.iter().enumerate().filter(|(i, e)| eligible(e) && Some(*i) != skip).find_map(|(i, e)| {
            let w = e.weight as usize;
            if left < w {
                Some(i)
            } else {
                left -= w;
                None
            }
        })
    };
    let weight_of = |skip: Option<usize>| -> usize {
        endpoints
            .iter()
            .enumerate()
            .filter(|(i, e)| eligible(e) && Some(*i) != skip)
            .map(|(_, e)| e.weight as usize)
            .sum()
    };
    let a = draw(None, random(weight_of(None).max(1)))?;
    let rest = weight_of(Some(a));
    if rest == 0 {
        return Some(a);
    }
    let b = draw(Some(a), random(rest))?;
    let (ea, eb) = (&endpoints[a], &endpoints[b]);
    // Fewer in flight per unit of weight; compared without division.
    let load = |e: &Candidate, other: &Candidate| e.in_flight as u128 * u128::from(other.weight);
    Some(if load(eb, ea) < load(ea, eb) { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::endpoint::Availability;

    fn w(weight: u32, in_flight: usize) -> Candidate {
        Candidate { availability: Availability::Open, in_flight, tried: false, weight }
    }

    fn open(e: &Candidate) -> bool {
        e.availability == Availability::Open
    }

    #[test]
    fn round_robin_gives_each_its_weight_of_a_turn() {
        let endpoints = [w(3, 0), w(1, 0), w(2, 0)];
        let mut counts = [0; 3];
        for next in 0..600 {
            counts[round_robin(&endpoints, open, next).unwrap()] += 1;
        }
        assert_eq!(counts, [300, 100, 200]);
        let closed = [w(3, 0), Candidate { availability: Availability::Closed, ..w(1, 0) }, w(2, 0)];
        assert_eq!(round_robin(&closed, open, 3), Some(2), "a closed endpoint's turn goes to the next");
    }

    #[test]
    fn least_request_draws_by_weight_and_compares_load_per_weight() {
        let endpoints = [w(95, 0), w(5, 0)];
        let mut counts = [0; 2];
        let mut seed = 7u64;
        let mut random = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % n
        };
        for _ in 0..10_000 {
            // Idle endpoints: the first drawn wins a tie, so draws decide.
            counts[least_request(&endpoints, open, &mut random).unwrap()] += 1;
        }
        assert!((9_300..=9_700).contains(&counts[0]), "{counts:?}");
        // 10 in flight on weight 10 is less loaded than 2 on weight 1.
        let busy = [w(10, 10), w(1, 2)];
        assert_eq!(least_request(&busy, open, |_| 0), Some(0));
        assert_eq!(least_request(&[w(10, 30), w(1, 2)], open, |_| 0), Some(1));
        assert_eq!(least_request(&[w(2, 0)], open, |_| 0), Some(0));
    }
}
