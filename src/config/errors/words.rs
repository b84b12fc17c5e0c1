//! serde's and the `config` crate's words for a value of the wrong type
//! ("invalid type: map, expected a sequence", "64-bit integer `-1`,
//! expected an unsigned 64 bit or less integer") said in the file's words
//! (table, list, whole number), with a value that may be a secret not shown:
//! such messages land in CI logs and reload answers.

use crate::config::redact::{REDACTED, names_secret, redact_text};

/// `message` about `key` (`routes[0].auth`) in the file's words; any other
/// message is returned as it is.
pub(super) fn plain(key: &str, message: String) -> String {
    let Some((kind, rest)) = ["invalid type: ", "invalid value: "].iter().find_map(|p| {
        let rest = message.strip_prefix(p)?;
        Some((&p[..p.len() - 2], rest))
    }) else {
        return message;
    };
    // The expected text is the gateway's own or the crates' and never holds
    // ", expected "; the value before it may.
    let Some((found, expected)) = rest.rsplit_once(", expected ") else { return message };
    let found = value(key, found);
    let expected = expected_words(expected);
    let hint = match (key, found.as_str()) {
        ("routes", "table") => "; each route is its own [[routes]] table, with two brackets",
        (_, f) if f.starts_with("string ") && expected == "a list" => {
            "; a list is written in brackets, even with one entry: [\"...\"]"
        }
        _ => "",
    };
    format!("{kind}: {found}, expected {expected}{hint}")
}

/// The value serde or the `config` crate describes as `found`, its type in
/// TOML's words, and its text or number not shown under a key that names a
/// secret (or, whatever the key, when it is a credential).
fn value(key: &str, found: &str) -> String {
    let secret = key.split(['.', '[', ']']).any(names_secret);
    if let Some(quoted) = found.strip_prefix("string ") {
        let inner = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')).unwrap_or(quoted);
        return match secret {
            true => format!("string {REDACTED}"),
            false => match redact_text(inner) {
                shown if shown == REDACTED => format!("string {REDACTED}"),
                shown => format!("string \"{shown}\""),
            },
        };
    }
    let scalar = |name: &str, rest: &str| {
        let number = rest.trim_matches('`');
        let number = number.strip_suffix(" as i128").or_else(|| number.strip_suffix(" as u128")).unwrap_or(number);
        if secret { format!("{name} {REDACTED}") } else { format!("{name} {number}") }
    };
    for (prefix, name) in [
        ("64-bit unsigned integer ", "integer"),
        ("128-bit unsigned integer ", "integer"),
        ("64-bit integer ", "integer"),
        ("128-bit integer ", "integer"),
        ("integer ", "integer"),
        ("floating point ", "float"),
        ("boolean ", "boolean"),
    ] {
        if let Some(rest) = found.strip_prefix(prefix) {
            return scalar(name, rest);
        }
    }
    match found {
        "map" => "table".into(),
        "sequence" => "list".into(),
        "unit value" => "empty value".into(),
        other => other.into(),
    }
}

/// What the crates say a key expects, in the file's words; the gateway's
/// own `expecting` texts pass as they are.
fn expected_words(expected: &str) -> String {
    match expected {
        "a map" => return "a table".into(),
        "a sequence" | "an array" => return "a list".into(),
        "a floating point" => return "a number".into(),
        "an unsigned 64 bit or less integer" | "an unsigned 128 bit or less integer" => {
            return "a whole number, 0 or more".into();
        }
        _ => {}
    }
    let bits = expected
        .strip_prefix("an unsigned ")
        .and_then(|r| r.strip_suffix(" bit integer"))
        .and_then(|b| b.parse::<u32>().ok())
        .filter(|b| *b < 64);
    if let Some(bits) = bits {
        return format!("a whole number from 0 to {}", (1u64 << bits) - 1);
    }
    if expected.starts_with("an signed ") {
        return "an integer".into();
    }
    expected.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_in_the_files_words() {
        for (key, message, want) in [
            ("routes", "invalid type: map, expected a sequence", "invalid type: table, expected a list; each route"),
            ("a.set", "invalid type: sequence, expected a map", "invalid type: list, expected a table"),
            (
                "a.n",
                "invalid type: 64-bit integer `-1`, expected an unsigned 64 bit or less integer",
                "integer -1, expected a whole number, 0 or more",
            ),
            (
                "a.n",
                "invalid type: 64-bit unsigned integer `5000000000`, expected an unsigned 32 bit integer",
                "integer 5000000000, expected a whole number from 0 to 4294967295",
            ),
            (
                "a.n",
                "invalid type: floating point `1.5`, expected an integer",
                "invalid type: float 1.5, expected an integer",
            ),
            ("a.n", "invalid value: integer `-5`, expected a size", "invalid value: integer -5, expected a size"),
            ("a.b", "invalid type: string \"four\", expected an integer", "string \"four\", expected an integer"),
            ("a.b", "invalid type: boolean `true`, expected a string", "boolean true, expected a string"),
            ("a.b", "unknown key", "unknown key"),
            (
                "r.methods",
                "invalid type: string \"GET\", expected a sequence",
                "expected a list; a list is written in brackets, even with one entry: [\"...\"]",
            ),
        ] {
            let shown = plain(key, message.to_owned());
            assert!(shown.contains(want), "{message}: {shown}");
        }
    }

    #[test]
    fn a_value_that_may_be_a_secret_is_not_shown() {
        for (key, message, secret) in [
            ("rate_limit_store", "invalid type: string \"redis://:hunter2@h:6379\", expected a table", "hunter2"),
            ("routes[0].auth", "invalid type: string \"Bearer abc123\", expected a table", "abc123"),
            ("routes[0].auth.basic", "invalid type: string \"admin:pw123\", expected a table", "pw123"),
            (
                "routes[0].x",
                "invalid type: string \"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln\", expected a table",
                "c2ln",
            ),
            ("upstreams.a.api_key", "invalid type: integer `123456`, expected a table", "123456"),
        ] {
            let shown = plain(key, message.to_owned());
            assert!(!shown.contains(secret) && shown.contains(REDACTED), "{shown}");
        }
    }
}
