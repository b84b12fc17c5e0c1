//! RFC 9110 §5.6.4's quoted-string, written: for a value that a recipient
//! would otherwise split or misread (a `Forwarded` host with a port, a
//! list member holding a comma).

/// Appends `value` to `out` in quotes, each `"` and `\` escaped.
pub fn push_quoted(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'"');
    for &b in value {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_backslashes_are_escaped() {
        for (value, want) in [("", "\"\""), ("a, b", "\"a, b\""), ("a\"b\\c", "\"a\\\"b\\\\c\"")] {
            let mut out = Vec::new();
            push_quoted(&mut out, value.as_bytes());
            assert_eq!(String::from_utf8(out).unwrap(), want, "{value:?}");
        }
    }
}
