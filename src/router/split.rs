//! A route's `split`: which of its upstreams takes a request, by weight,
//! optionally sticky to a header's or cookie's value. Pure, table-tested.
//!
//! A sticky choice is rendezvous hashing with weights: each upstream scores
//! the key by a hash of the key and its name, scaled by its weight, and the
//! highest score wins. The same key gets the same upstream on every
//! gateway, across restarts and reloads; when weights move a little, only
//! as many keys move as the change in shares makes necessary. The hash is a
//! fixed one (FNV-1a, then a mix), not the per-process seeded one of the
//! router's maps, for exactly that reason; a client choosing keys can only
//! choose which upstream it lands on, which it could by sending another
//! key anyway.
//!
//! A split keyed by a cookie may set the cookie itself (`set = true`): a
//! request without it is given a random key, chosen by like any other, and
//! the answer carries it back. The key names no upstream, so the cookie
//! tells a client nothing of the versions there are; it is not a secret
//! either (a client may send any key it likes).

use std::time::Duration;

use http::header::{COOKIE, HeaderValue};
use http::{HeaderMap, HeaderName};

/// One upstream of a split.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Index into the configuration's upstreams.
    pub upstream: usize,
    pub name: String,
    pub weight: u32,
}

/// What a sticky choice is keyed by.
#[derive(Debug, Clone, PartialEq)]
pub enum Sticky {
    Header(HeaderName),
    Cookie(String),
}

impl Sticky {
    /// Reads `header:NAME` or `cookie:NAME`.
    pub fn parse(text: &str) -> Result<Sticky, String> {
        let usage = || format!("{text:?}: use \"header:NAME\" or \"cookie:NAME\"");
        match text.split_once(':') {
            Some(("header", name)) => HeaderName::from_bytes(name.trim().as_bytes())
                .map(Sticky::Header)
                .map_err(|_| format!("{text:?}: {name:?} is not a header name")),
            Some(("cookie", name)) if is_cookie_name(name.trim()) => Ok(Sticky::Cookie(name.trim().to_owned())),
            _ => Err(usage()),
        }
    }

    /// The request's key: the header's first value, or the cookie's value;
    /// `None` when it has none (or an empty one).
    fn key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        let key = match self {
            Sticky::Header(name) => headers.get(name).map(|v| v.as_bytes()),
            Sticky::Cookie(name) => headers.get_all(COOKIE).iter().find_map(|line| {
                line.as_bytes().split(|&b| b == b';').find_map(|pair| value_of(pair, name).filter(|v| !v.is_empty()))
            }),
        };
        key.filter(|k| !k.is_empty())
    }

    pub fn describe(&self) -> String {
        match self {
            Sticky::Header(name) => format!("header:{name}"),
            Sticky::Cookie(name) => format!("cookie:{name}"),
        }
    }
}

/// The value of a cookie pair (`NAME=VALUE`, spaces around either
/// trimmed, a quoted value without its quotes, RFC 6265 §4.1.1) if it is
/// named `name`; a bare `NAME` is that name with an empty value, as
/// upstreams' parsers read it (Go's `sid` is `sid=""`).
fn value_of<'p>(pair: &'p [u8], name: &str) -> Option<&'p [u8]> {
    let pair = pair.trim_ascii();
    let (named, value) = match pair.iter().position(|&b| b == b'=') {
        Some(eq) => (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii()),
        None => (pair, &pair[pair.len()..]),
    };
    let value = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    (named == name.as_bytes()).then_some(value)
}

fn is_cookie_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// The sticky cookie a split sets for a request without it (`set = true`).
#[derive(Debug, Clone, PartialEq)]
pub struct SetCookie {
    /// `Max-Age`; without it the cookie lasts the browser's session.
    pub max_age: Option<Duration>,
}

impl SetCookie {
    /// The `Set-Cookie` field: for the whole site, out of scripts' reach,
    /// not sent on other sites' subrequests, and over TLS only when the
    /// client came over TLS.
    fn field(&self, name: &str, key: &str, tls: bool) -> HeaderValue {
        let mut field = format!("{name}={key}; Path=/; HttpOnly; SameSite=Lax");
        if let Some(age) = self.max_age {
            field.push_str(&format!("; Max-Age={}", age.as_secs()));
        }
        if tls {
            field.push_str("; Secure");
        }
        HeaderValue::try_from(field).expect("a cookie name is checked at load; the key is hex")
    }
}

/// The `Set-Cookie` field a request's answer carries, in its extensions.
#[derive(Debug, Clone)]
pub struct NewCookie(pub HeaderValue);

/// A route's weighted upstreams.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub members: Vec<Member>,
    pub sticky: Option<Sticky>,
    pub set_cookie: Option<SetCookie>,
    total: u64,
}

impl Split {
    /// `members` must hold at least one of weight above zero.
    pub fn new(members: Vec<Member>, sticky: Option<Sticky>) -> Split {
        let total = members.iter().map(|m| u64::from(m.weight)).sum();
        Split { members, sticky, set_cookie: None, total }
    }

    /// [`Split::choose`], but for a request without the sticky cookie when
    /// the split sets it: a new random key chooses, is added to the
    /// request's `Cookie` (so the upstream sees what later requests will
    /// carry), and comes back as the `Set-Cookie` field for the answer.
    pub fn choose_or_set(
        &self,
        headers: &mut HeaderMap,
        tls: bool,
        random: impl FnOnce(u64) -> u64,
    ) -> (usize, Option<HeaderValue>) {
        // (The new key is drawn with `fastrand`, like request IDs: it
        // only places a client, it guards nothing.)
        let Some(sticky @ Sticky::Cookie(name)) = &self.sticky else {
            return (self.choose(headers, random), None);
        };
        if sticky.key(headers).is_some() {
            only_chosen_pair(headers, name);
            return (self.choose(headers, random), None);
        }
        let Some(set) = &self.set_cookie else {
            return (self.choose(headers, random), None);
        };
        let key = format!("{:032x}", fastrand::u128(..));
        // One `Cookie` line, as RFC 6265 has it: the pair joins the others,
        // and is the only one of its name (those there are empty, and a
        // parser that takes the first would see one).
        let lines: Vec<Vec<u8>> = headers.get_all(COOKIE).iter().map(|v| without_pair(v.as_bytes(), name)).collect();
        let mut pairs: Vec<&[u8]> = lines.iter().map(|l| l.as_slice()).filter(|l| !l.is_empty()).collect();
        let pair = format!("{name}={key}");
        pairs.push(pair.as_bytes());
        let joined = HeaderValue::from_bytes(&pairs.join(&b"; "[..])).expect("from header values and visible ASCII");
        headers.insert(COOKIE, joined);
        (self.by_key(key.as_bytes()), Some(set.field(name, &key, tls)))
    }

    /// The upstream for a request with these headers: by its sticky key
    /// when it has one, else at random by weight. `random(n)` gives a
    /// number below `n`.
    pub fn choose(&self, headers: &HeaderMap, random: impl FnOnce(u64) -> u64) -> usize {
        match self.sticky.as_ref().and_then(|s| s.key(headers)) {
            Some(key) => self.by_key(key),
            None => {
                let mut left = random(self.total.max(1));
                for m in &self.members {
                    if left < u64::from(m.weight) {
                        return m.upstream;
                    }
                    left -= u64::from(m.weight);
                }
                self.members[0].upstream
            }
        }
    }

    /// Weighted rendezvous: the highest `weight / -ln(u)`, `u` in (0, 1)
    /// from the hash of the key and the member's name.
    fn by_key(&self, key: &[u8]) -> usize {
        let key_hash = fnv1a(key, FNV_OFFSET);
        let score = |m: &Member| {
            if m.weight == 0 {
                return f64::NEG_INFINITY;
            }
            let h = mix(fnv1a(m.name.as_bytes(), key_hash));
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            f64::from(m.weight) / -u.ln()
        };
        let best = self.members.iter().map(|m| (score(m), m.upstream)).max_by(|a, b| a.0.total_cmp(&b.0));
        best.map_or(self.members[0].upstream, |(_, upstream)| upstream)
    }
}

/// A `Cookie` line without its pairs named `name`, trimmed; a line
/// without such a pair is kept as it is.
fn without_pair(line: &[u8], name: &str) -> Vec<u8> {
    let line = line.trim_ascii();
    if !line.split(|&b| b == b';').any(|p| value_of(p, name).is_some()) {
        return line.to_vec();
    }
    let kept: Vec<&[u8]> = line
        .split(|&b| b == b';')
        .filter(|p| value_of(p, name).is_none())
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
        .collect();
    kept.join(&b"; "[..])
}

/// Leaves one pair named `name` in the request's `Cookie` lines: the first
/// with a value, the one [`Sticky::key`] routes by. The others of that
/// name (empty, or later) are taken out, so an upstream reads the value
/// the route was chosen by whichever of them its parser takes. Lines
/// without such a pair are kept as sent; a line left with no pair goes.
fn only_chosen_pair(headers: &mut HeaderMap, name: &str) {
    let named =
        |line: &HeaderValue| line.as_bytes().split(|&b| b == b';').filter(|p| value_of(p, name).is_some()).count();
    if headers.get_all(COOKIE).iter().map(named).sum::<usize>() < 2 {
        return;
    }
    let mut chosen = false;
    let mut keep = |pair: &&[u8]| match value_of(pair, name) {
        None => true,
        Some(value) => {
            let first = !chosen && !value.is_empty();
            chosen |= first;
            first
        }
    };
    let mut lines = Vec::new();
    for line in headers.get_all(COOKIE) {
        if named(line) == 0 {
            lines.push(line.clone());
            continue;
        }
        let pairs: Vec<&[u8]> = line
            .as_bytes()
            .split(|&b| b == b';')
            .filter(&mut keep)
            .map(<[u8]>::trim_ascii)
            .filter(|p| !p.is_empty())
            .collect();
        if !pairs.is_empty() {
            lines.push(HeaderValue::from_bytes(&pairs.join(&b"; "[..])).expect("pieces of a header value"));
        }
    }
    headers.remove(COOKIE);
    for line in lines {
        headers.append(COOKIE, line);
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// splitmix64's finaliser: FNV's low bits alone are poorly spread.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(weights: &[(&str, u32)], sticky: Option<Sticky>) -> Split {
        let members = weights
            .iter()
            .enumerate()
            .map(|(i, (name, weight))| Member { upstream: i, name: (*name).to_owned(), weight: *weight })
            .collect();
        Split::new(members, sticky)
    }

    fn keyed(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        h
    }

    #[test]
    fn sticky_parses_header_and_cookie() {
        assert_eq!(Sticky::parse("header:X-User"), Ok(Sticky::Header(HeaderName::from_static("x-user"))));
        assert_eq!(Sticky::parse("cookie:session"), Ok(Sticky::Cookie("session".into())));
        for bad in ["x-user", "header:", "header:bad name", "cookie:", "cookie:a;b", "query:x"] {
            assert!(Sticky::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cookie_key_is_found_among_others() {
        let s = Sticky::Cookie("sid".into());
        let cases: &[(&str, Option<&[u8]>)] = &[
            ("sid=abc", Some(b"abc")),
            ("a=1; sid=abc; b=2", Some(b"abc")),
            ("a=1;sid = abc", Some(b"abc")),
            ("sidx=abc", None),
            ("sid=", None),
            ("sid=; sid=abc", Some(b"abc")),
            ("a=sid", None),
            // A bare name and a quoted empty value are empty values (a Go
            // upstream reads both as `sid=""`); quotes are not the value.
            ("sid", None),
            ("sid; sid=abc", Some(b"abc")),
            ("sid=\"\"; sid=abc", Some(b"abc")),
            ("sid=\"abc\"", Some(b"abc")),
            ("sid=\"", Some(b"\"")),
        ];
        for (cookie, want) in cases {
            assert_eq!(s.key(&keyed("cookie", cookie)), *want, "{cookie}");
        }
    }

    #[test]
    fn a_split_that_sets_its_cookie_gives_one_to_requests_without_it() {
        let mut s = split(&[("v1", 1), ("v2", 1)], Some(Sticky::Cookie("sid".into())));
        s.set_cookie = Some(SetCookie { max_age: Some(Duration::from_secs(3600)) });
        // (cookie lines sent, TLS) -> the Cookie the upstream gets, the field's attributes
        let cases: &[(&[&str], bool, Option<&str>, &str)] = &[
            (&[], false, Some("sid=K"), "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600"),
            (&["a=1"], true, Some("a=1; sid=K"), "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600; Secure"),
            (&["a=1", "b=2"], false, Some("a=1; b=2; sid=K"), "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600"),
            // An empty one is dropped: the upstream sees one `sid`, the new key.
            (&["sid="], false, Some("sid=K"), "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600"),
            (
                &["a=1; sid=;b=2", "sid = ", "c=3;d=4"],
                false,
                Some("a=1; b=2; c=3;d=4; sid=K"),
                "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600",
            ),
            (
                &["sidx=; a=sid; sid", "sid=\"\""],
                false,
                Some("sidx=; a=sid; sid=K"),
                "; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600",
            ),
            // Has one: chosen by it, nothing set.
            (&["a=1; sid=mine"], false, None, ""),
        ];
        for (lines, tls, want_cookie, attributes) in cases {
            let mut h = HeaderMap::new();
            for line in *lines {
                h.append(COOKIE, line.parse().unwrap());
            }
            let (chosen, field) = s.choose_or_set(&mut h, *tls, |_| 0);
            let Some(want_cookie) = want_cookie else {
                assert!(field.is_none(), "{lines:?}");
                assert_eq!(chosen, s.by_key(b"mine"));
                continue;
            };
            let field = field.expect("a cookie is set").to_str().unwrap().to_owned();
            let key = &field["sid=".len()..field.find(';').unwrap()];
            assert!(key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{field}");
            assert_eq!(field, format!("sid={key}{attributes}"));
            assert_eq!(h.get(COOKIE).unwrap(), &want_cookie.replace('K', key), "{lines:?}");
            assert_eq!(h.get_all(COOKIE).iter().count(), 1);
            assert_eq!(chosen, s.by_key(key.as_bytes()), "the new key chooses");
            assert_eq!(s.choose(&h, |_| unreachable!()), chosen, "and chooses the same again");
        }
        // Without `set`, or keyed by a header, nothing is set.
        let mut h = HeaderMap::new();
        assert_eq!(
            split(&[("v1", 1), ("v2", 1)], Some(Sticky::Cookie("sid".into()))).choose_or_set(&mut h, false, |_| 1).1,
            None
        );
        assert!(h.is_empty());
    }

    /// A request that has the sticky cookie goes upstream with exactly one
    /// pair of its name, the one it was routed by, and its other cookies
    /// as sent. Before, `sid=; sid=abc` was routed by `abc` and went
    /// upstream as it was: a parser taking the first read it empty.
    #[test]
    fn the_upstream_sees_only_the_pair_the_route_was_chosen_by() {
        // (cookie lines sent) -> the lines the upstream gets
        let cases: &[(&[&str], &[&str])] = &[
            (&["sid=abc"], &["sid=abc"]),
            (&["a=1;  sid=abc;b=2"], &["a=1;  sid=abc;b=2"]),
            (&["sid=; sid=abc"], &["sid=abc"]),
            (&["sid=abc; sid=def"], &["sid=abc"]),
            (&["a=1; sid=; b=2; sid = abc ; c=3"], &["a=1; b=2; sid = abc; c=3"]),
            (&["sid=", "x=1", "sid=abc; y=2", "sid=zzz"], &["x=1", "sid=abc; y=2"]),
            (&["sidx=1; sid", "sid=abc"], &["sidx=1", "sid=abc"]),
            (&["sid=\"\"; a=1", "sid=\"abc\""], &["a=1", "sid=\"abc\""]),
        ];
        for set in [false, true] {
            let mut s = split(&[("v1", 1), ("v2", 1)], Some(Sticky::Cookie("sid".into())));
            s.set_cookie = set.then_some(SetCookie { max_age: None });
            for (lines, want) in cases {
                let mut h = HeaderMap::new();
                for line in *lines {
                    h.append(COOKIE, line.parse().unwrap());
                }
                let (chosen, field) = s.choose_or_set(&mut h, false, |_| unreachable!());
                assert!(field.is_none(), "{lines:?}");
                assert_eq!(chosen, s.by_key(b"abc"), "{lines:?}");
                let got: Vec<&str> = h.get_all(COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
                assert_eq!(got, *want, "{lines:?}");
            }
        }
    }

    #[test]
    fn random_choice_follows_weights() {
        let s = split(&[("v1", 95), ("v2", 5)], None);
        assert_eq!(s.choose(&HeaderMap::new(), |_| 94), 0);
        assert_eq!(s.choose(&HeaderMap::new(), |_| 95), 1);
        assert_eq!(s.choose(&HeaderMap::new(), |_| 99), 1);
        assert_eq!(split(&[("v1", 0), ("v2", 3)], None).choose(&HeaderMap::new(), |_| 0), 1);
    }

    #[test]
    fn sticky_keys_share_by_weight_and_few_move_when_weights_move_a_little() {
        let sticky = Some(Sticky::Header(HeaderName::from_static("x-user")));
        let before = split(&[("v1", 95), ("v2", 5)], sticky.clone());
        let after = split(&[("v1", 90), ("v2", 10)], sticky);
        let (mut on_v2, mut moved, mut back) = (0, 0, 0);
        for user in 0..10_000 {
            let h = keyed("x-user", &format!("user-{user}"));
            let (a, b) = (before.choose(&h, |_| unreachable!()), after.choose(&h, |_| unreachable!()));
            on_v2 += a;
            moved += usize::from(a != b);
            back += usize::from(a == 1 && b == 0);
            assert_eq!(before.choose(&h, |_| unreachable!()), a, "the same key, the same upstream");
        }
        assert!((400..=600).contains(&on_v2), "about 5% on v2: {on_v2}");
        // 95/5 to 90/10 moves about 5% of keys, all of them towards v2.
        assert!((400..=650).contains(&moved), "{moved} moved");
        assert_eq!(back, 0, "no key on v2 goes back to v1 when v2 grows");
    }
}
