//! Entity-tag lists (`If-None-Match`, `If-Match`), split as RFC 9110 §8.8.3
//! writes them: a tag is `[W/]"..."`, and its quotes may hold a comma, so a
//! list is not split at every comma.

/// The members of one list line: each entity tag as written (`W/` kept),
/// `*`, or a member that is neither (kept as it is, matching no tag).
pub fn entity_tags(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return None;
        }
        let opaque = rest.strip_prefix("W/").unwrap_or(rest);
        let end = match opaque.strip_prefix('"').and_then(|q| q.find('"')) {
            // The closing quote, past the opening one (and `W/`).
            Some(close) => rest.len() - opaque.len() + close + 2,
            None => rest.find(',').unwrap_or(rest.len()),
        };
        let (tag, after) = rest.split_at(end);
        rest = after;
        Some(tag.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_outside_quotes() {
        let cases: &[(&str, &[&str])] = &[
            ("\"a\"", &["\"a\""]),
            ("\"a\", W/\"b\"", &["\"a\"", "W/\"b\""]),
            ("W/\"a,b\", \"c\"", &["W/\"a,b\"", "\"c\""]),
            ("\"a,b\"", &["\"a,b\""]),
            ("*", &["*"]),
            (" , \"a\" ,, ", &["\"a\""]),
            ("junk, \"a\"", &["junk", "\"a\""]),
            ("\"unclosed, \"a\"", &["\"unclosed, \"", "a\""]),
            ("", &[]),
        ];
        for (line, want) in cases {
            assert_eq!(entity_tags(line).collect::<Vec<_>>(), *want, "{line:?}");
        }
    }
}
