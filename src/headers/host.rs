//! The `Host` value check, one pass over its bytes.

/// Whether a `Host` value is `host[:port]` (RFC 9110 §7.2, RFC 3986
/// §3.2.2) naming a host: reg-name characters or an IPv4 address, or an
/// IP literal in brackets, then at most a colon and digits; a name that is
/// not empty and has no empty label but a last one (`example.com.`), as an
/// `http` URI needs (RFC 9110 §4.2.1: an empty host is invalid), so `.`,
/// `..`, `:80` and an empty `Host` are refused, as nginx refuses them.
/// A percent-encoded name (`%61dmin.example.com`) is refused too: RFC
/// 3986 allows one, but routes compare names as they are spelt and an
/// upstream that decodes would read another host than the route chose
/// (`:authority` over HTTP/2 refuses `%` already; no DNS name holds one).
/// Checked by hand in one pass over the bytes: `http::uri::Authority`'s
/// parser copies the value first, a cost on every proxied request (see
/// benches/README.md, Decisions).
pub fn valid_host(value: &[u8]) -> bool {
    // One pass over the bytes, each looked up once.
    let port = |digits: &[u8]| digits.iter().all(u8::is_ascii_digit);
    match value.split_first() {
        Some((b'[', literal)) => {
            for (i, &b) in literal.iter().enumerate() {
                match HOST_BYTES[b as usize] {
                    HOST | DOT | COLON => {}
                    CLOSE if i > 0 => {
                        return match &literal[i + 1..] {
                            [] => true,
                            [b':', digits @ ..] => port(digits),
                            _ => false,
                        };
                    }
                    _ => return false,
                }
            }
            false
        }
        _ => {
            // A leading dot starts with an empty label.
            let mut after_dot = true;
            for (i, &b) in value.iter().enumerate() {
                match HOST_BYTES[b as usize] {
                    DOT if after_dot => return false,
                    DOT => after_dot = true,
                    HOST => after_dot = false,
                    COLON => return i > 0 && port(&value[i + 1..]),
                    _ => return false,
                }
            }
            !value.is_empty()
        }
    }
}

/// What [`valid_host`] makes of a byte: one of these.
const NOT: u8 = 0;
const HOST: u8 = 1;
const COLON: u8 = 2;
const OPEN: u8 = 3;
const CLOSE: u8 = 4;
/// A name's `.`, which ends a label.
const DOT: u8 = 5;

/// Each byte's class for [`valid_host`], as a table (one load per byte).
const HOST_BYTES: [u8; 256] = {
    let mut table = [NOT; 256];
    let extra = b"-._~!$&'()*+,;=";
    let mut i = 0;
    while i < 256 {
        if (i as u8).is_ascii_alphanumeric() {
            table[i] = HOST;
        }
        i += 1;
    }
    let mut j = 0;
    while j < extra.len() {
        table[extra[j] as usize] = HOST;
        j += 1;
    }
    table[b'.' as usize] = DOT;
    table[b':' as usize] = COLON;
    table[b'[' as usize] = OPEN;
    table[b']' as usize] = CLOSE;
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts without a name, and percent-encoded ones: refused, as forms of
    /// `host[:port]` though they are.
    #[test]
    fn a_host_names_a_host() {
        for ok in ["example.com", "example.com.", "a", "a.b:80", "h:", "127.000.000.001", "[::1]:80", "x.-y", "[1.2]"] {
            assert!(valid_host(ok.as_bytes()), "{ok}");
        }
        let percent = ["%61dmin.example.com", "admin%2Eexample.com", "[::1%25lo]", "a%"];
        let empty = ["", ":", ":80", ".", "..", ".example.com", "example..com", "example.com..", "..:80", "a..:1"];
        for bad in empty.into_iter().chain(percent) {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }

    /// The one-pass [`valid_host`] against the check it replaced (four passes
    /// over the value) and a name with no empty label but a last one, on
    /// every value of up to five bytes drawn from the bytes that decide it.
    #[test]
    fn hosts_are_judged_as_the_passes_before_judged_them() {
        fn before(value: &[u8]) -> bool {
            let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]".contains(&b);
            if !value.iter().all(|&b| allowed(b)) {
                return false;
            }
            let (host, port) = match value.strip_prefix(b"[") {
                Some(literal) => match literal.iter().position(|&b| b == b']') {
                    Some(end) if end > 0 => (&literal[..end], &literal[end + 1..]),
                    _ => return false,
                },
                None => value.split_at(value.iter().position(|&b| b == b':').unwrap_or(value.len())),
            };
            let in_brackets = value.first() == Some(&b'[');
            if host.iter().any(|&b| b == b'[' || b == b']' || (b == b':' && !in_brackets)) {
                return false;
            }
            let port_ok = match port.split_first() {
                None => true,
                Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
                Some(_) => false,
            };
            // And a name: not empty, no empty label but the last.
            let named =
                in_brackets || (!host.is_empty() && !host.starts_with(b".") && !host.windows(2).any(|w| w == b".."));
            port_ok && named
        }
        let alphabet = b"[]:a1_ /@\x80.";
        let mut value = Vec::new();
        let mut checked = 0;
        for len in 0..=5u32 {
            for mut n in 0..alphabet.len().pow(len) {
                value.clear();
                for _ in 0..len {
                    value.push(alphabet[n % alphabet.len()]);
                    n /= alphabet.len();
                }
                assert_eq!(valid_host(&value), before(&value), "{:?}", String::from_utf8_lossy(&value));
                checked += 1;
            }
        }
        assert!(checked > 100_000);
        for b in 0..=255u8 {
            for value in [vec![b], vec![b'[', b':', b, b']'], vec![b'h', b':', b]] {
                assert_eq!(valid_host(&value), before(&value), "{value:?}");
            }
        }
    }
}
