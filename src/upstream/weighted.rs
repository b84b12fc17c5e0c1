//! Balancing over endpoints of unequal `weight`: pure, table-tested. With
//! equal weights `endpoint::pick` keeps its unweighted ways.

use super::endpoint::Candidate;

/// Round robin: the counter walks a wheel where each eligible endpoint
/// holds as many places as its weight (so runs of one endpoint, in
/// proportion). A closed endpoint holds no place, so its share is spread
/// over the others by their weights, not handed to its neighbour.
pub fn round_robin(endpoints: &[Candidate], eligible: impl Fn(&Candidate) -> bool, next: usize) -> Option<usize> {
    let total: u64 = endpoints.iter().filter(|e| eligible(e)).map(|e| u64::from(e.weight)).sum();
    let mut place = (next as u64) % total.max(1);
    let landed = endpoints.iter().position(|e| {
        if !eligible(e) {
            return false;
        }
        let inside = place < u64::from(e.weight);
        place = place.saturating_sub(u64::from(e.weight));
        inside
    });
    // Only when every eligible endpoint weighs 0 (never, as configured).
    landed.or_else(|| endpoints.iter().position(eligible))
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

    /// A seeded "random" source: numbers below its argument.
    fn lcg(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |n| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % n
        }
    }

    #[test]
    fn round_robin_gives_each_its_weight_of_a_turn() {
        let endpoints = [w(3, 0), w(1, 0), w(2, 0)];
        let mut counts = [0; 3];
        for next in 0..600 {
            counts[round_robin(&endpoints, open, next).unwrap()] += 1;
        }
        assert_eq!(counts, [300, 100, 200]);
    }

    #[test]
    fn least_request_draws_by_weight_and_compares_load_per_weight() {
        let endpoints = [w(95, 0), w(5, 0)];
        let mut counts = [0; 2];
        let mut random = lcg(7);
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

    /// Through `endpoint::pick`, both balancers, weighted or not: over many
    /// requests each open endpoint's share is its weight's share of the open
    /// endpoints' weight (within 1% of the requests), whichever are closed;
    /// a closed endpoint's share is not handed to its neighbour.
    #[test]
    fn a_closed_endpoints_share_is_spread_over_the_open_ones_by_weight() {
        use crate::config::Balance;
        use crate::upstream::endpoint::pick;
        // (weights, the indexes of the closed endpoints)
        let cases: [(&[u32], &[usize]); 8] = [
            (&[1, 1, 1], &[0]),
            (&[1, 1, 1, 1], &[1]),
            (&[1, 1, 1, 1], &[0, 1]),
            (&[2, 2, 2], &[2]),
            (&[100, 1, 100], &[0]),
            (&[3, 1, 2], &[1]),
            (&[5, 2, 2, 1], &[0, 2]),
            (&[3, 1, 2], &[]),
        ];
        let n = 60_600;
        for (weights, closed) in cases {
            let endpoints: Vec<Candidate> = (0..weights.len())
                .map(|i| {
                    let availability = if closed.contains(&i) { Availability::Closed } else { Availability::Open };
                    Candidate { availability, ..w(weights[i], 0) }
                })
                .collect();
            let open_weight: u32 = endpoints.iter().filter(|e| open(e)).map(|e| e.weight).sum();
            for balance in [Balance::RoundRobin, Balance::LeastRequest] {
                let (mut counts, mut random) = (vec![0usize; weights.len()], lcg(7));
                for next in 0..n {
                    let (i, trial) = pick(&endpoints, balance, next, &mut random).unwrap();
                    assert!(!trial);
                    counts[i] += 1;
                }
                for (i, &got) in counts.iter().enumerate() {
                    let share = if closed.contains(&i) { 0.0 } else { f64::from(weights[i]) / f64::from(open_weight) };
                    let off = (got as f64 - share * n as f64).abs();
                    assert!(off <= n as f64 * 0.01, "{balance:?}, weights {weights:?}, closed {closed:?}: {counts:?}");
                }
            }
        }
    }
}
