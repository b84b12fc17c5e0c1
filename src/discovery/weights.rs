//! An SRV answer's weights turned into its endpoints' (RFC 2782): each
//! record's weight shared among its target's addresses, in the smallest
//! whole numbers that keep the proportions. Pure, so the rules are
//! table-tested.

use std::collections::HashMap;

use crate::config::EndpointConfig;

/// One SRV record's endpoints (both families), by its key and weight.
pub(super) type Record = (String, u16, Vec<EndpointConfig>);

/// The heaviest an endpoint weighs (as in the file).
const MAX_WEIGHT: u64 = 10_000;

/// How many times a record of weight 0 the lightest other weighs, when
/// there are both.
const ZERO_WEIGHT_SHARE: u64 = 100;

/// The endpoints of one priority's records, weighted as RFC 2782 has the
/// records chosen: each record's weight is shared among its addresses, in
/// the smallest whole numbers that keep the proportions (so round robin's
/// runs stay short), at most [`MAX_WEIGHT`]. A record of weight 0 among
/// heavier ones weighs 1 an address against at least
/// [`ZERO_WEIGHT_SHARE`] for the lightest other (the RFC's "very small
/// chance"; it still serves when they cannot), even where that bends the
/// others' proportions (see [`scale`]); when every record weighs 0 (and
/// for a name's own A and AAAA), every address weighs 1. An address of
/// several records weighs their sum.
pub(super) fn weighted(records: Vec<Record>) -> Vec<EndpointConfig> {
    let records: Vec<Record> = records.into_iter().filter(|(_, _, e)| !e.is_empty()).collect();
    // Each record's weight an address, in whole numbers: over the least
    // common multiple of the address counts (bounded: they are small).
    let lcm = records.iter().fold(1u64, |l, (_, _, e)| (l / gcd(l, e.len() as u64) * e.len() as u64).min(MAX_WEIGHT));
    let mut shares: Vec<u64> = records.iter().map(|(_, w, e)| u64::from(*w) * lcm / e.len() as u64).collect();
    let g = shares.iter().fold(0, |g, &s| gcd(g, s));
    if g > 0 {
        shares.iter_mut().for_each(|s| *s /= g);
        scale(&mut shares);
    }
    let mut out: Vec<EndpointConfig> = Vec::new();
    // Where each address is in `out`, found through a map, not a search
    // of `out` for each: an answer may hold thousands.
    let mut at: HashMap<String, usize> = HashMap::new();
    for ((_, _, endpoints), share) in records.into_iter().zip(shares) {
        let share = share.max(1) as u32;
        for mut e in endpoints {
            match at.get(&e.url) {
                Some(&i) if g > 0 => out[i].weight = (out[i].weight + share).min(MAX_WEIGHT as u32),
                Some(_) => {}
                None => {
                    at.insert(e.url.clone(), out.len());
                    e.weight = share;
                    out.push(e);
                }
            }
        }
    }
    out
}

/// Brings records' shares (in lowest terms, not all 0) within
/// [`MAX_WEIGHT`], those of weight 0 left at 0. Beside a share of 0 the
/// others are first raised so the lightest is at least
/// [`ZERO_WEIGHT_SHARE`], and scaling down never takes one below it: the
/// promise to a record of weight 0 holds, and at the extremes (records of
/// 65535 and 1) the others' proportions give instead.
fn scale(shares: &mut [u64]) {
    let least = if shares.contains(&0) { ZERO_WEIGHT_SHARE } else { 1 };
    let lightest = shares.iter().copied().filter(|&s| s > 0).min().unwrap_or(1);
    let times = least.div_ceil(lightest);
    shares.iter_mut().for_each(|s| *s *= times);
    let heaviest = shares.iter().copied().max().unwrap_or(1);
    if heaviest > MAX_WEIGHT {
        let down = |s: u64| ((s as f64 * MAX_WEIGHT as f64 / heaviest as f64).round() as u64).max(least);
        shares.iter_mut().filter(|s| **s > 0).for_each(|s| *s = down(*s));
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::super::hold::tests::at;
    use super::*;

    #[test]
    fn srv_weights_table() {
        // (records: weight, ports), the endpoints' (port, weight)
        type Case = (&'static str, Vec<(u16, &'static [u16])>, &'static [(u16, u32)]);
        let cases: Vec<Case> = vec![
            ("all 0: each weighs 1", vec![(0, &[1]), (0, &[2, 3])], &[(1, 1), (2, 1), (3, 1)]),
            ("in proportion, smallest numbers", vec![(60, &[1]), (40, &[2])], &[(1, 3), (2, 2)]),
            ("one of 0 among others", vec![(5, &[1]), (0, &[2])], &[(1, 100), (2, 1)]),
            ("0 among unequal others", vec![(2, &[1]), (3, &[2]), (0, &[3])], &[(1, 100), (2, 150), (3, 1)]),
            ("a record's weight shared by its addresses", vec![(50, &[1, 2]), (50, &[3])], &[(1, 1), (2, 1), (3, 2)]),
            ("an address of two records weighs both", vec![(10, &[1]), (10, &[1]), (30, &[2])], &[(1, 2), (2, 3)]),
            ("two records of 0, one address", vec![(0, &[1]), (0, &[1])], &[(1, 1)]),
            ("a record without addresses", vec![(9, &[]), (1, &[2])], &[(2, 1)]),
            ("too heavy: scaled to the bound", vec![(65535, &[1]), (1, &[2])], &[(1, 10_000), (2, 1)]),
            // Scaled down, the lightest other stays 100 times a record of 0.
            ("0 beside a too heavy one", vec![(65535, &[1]), (1, &[2]), (0, &[3])], &[(1, 10_000), (2, 100), (3, 1)]),
            ("0 beside 65535 and 300", vec![(65535, &[1]), (300, &[2]), (0, &[3])], &[(1, 10_000), (2, 100), (3, 1)]),
            // Where the proportions allow it, they are kept.
            ("scaled, 0 kept apart", vec![(65535, &[1]), (6554, &[2]), (0, &[3])], &[(1, 10_000), (2, 1_000), (3, 1)]),
            (
                "0 and a record of two",
                vec![(65535, &[1]), (1, &[2, 3]), (0, &[4])],
                &[(1, 10_000), (2, 100), (3, 100), (4, 1)],
            ),
            ("three addresses and two", vec![(1, &[1, 2, 3]), (1, &[4, 5])], &[(1, 2), (2, 2), (3, 2), (4, 3), (5, 3)]),
        ];
        for (name, records, want) in cases {
            let records = records
                .into_iter()
                .enumerate()
                .map(|(i, (w, ports))| (format!("t{i}:80"), w, ports.iter().map(|p| at(*p)).collect()))
                .collect();
            let got: Vec<(u16, u32)> = weighted(records)
                .iter()
                .map(|e| (e.url.rsplit(':').next().unwrap().parse().unwrap(), e.weight))
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
