//! What a newcomer's TOML syntax errors mean in the gateway's file: the
//! parser's "duplicate key" and "invalid float, expected nothing" say what
//! it saw, not what was meant (`[routes]` for `[[routes]]`, a text left
//! unquoted). A hint never repeats the value: it may be a secret.

/// A hint for the parser's `message` about the byte `at` of `text`.
pub(super) fn hint(text: &str, message: &str, at: usize) -> Option<String> {
    let start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let raw = text[start..].lines().next().unwrap_or("");
    if message.starts_with("duplicate key") {
        return Some(duplicate(text, raw.trim()));
    }
    if message.starts_with("key with no value") && raw.contains(':') {
        return Some("TOML joins a key and its value with `=`, not `:` (listen = \"...\")".into());
    }
    let (key, value) = raw.split_once('=')?;
    let (key, value) = (key.trim(), value.trim());
    // Only an error inside the value, where a quote, list or table is missing.
    if key.is_empty() || key.starts_with('[') || at <= start + raw.find('=')? {
        return None;
    }
    if value.starts_with(['"', '\'', '[', '{']) {
        return None;
    }
    if value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false") {
        return Some(format!("a boolean is written true or false, in lower case ({key} = true)"));
    }
    Some(format!("a text goes in quotes: {key} = \"...\""))
}

/// A table header or key that `line` writes a second time.
fn duplicate(text: &str, line: &str) -> String {
    if let Some(name) = line.strip_prefix("[[").and_then(|l| l.split("]]").next()) {
        let name = name.trim();
        return format!("[{name}] is a table above, so [[{name}]] (a list's entry) cannot follow it");
    }
    if let Some(name) = line.strip_prefix('[').and_then(|l| l.split(']').next()) {
        let name = name.trim();
        if text.lines().any(|l| l.trim().strip_prefix("[[").and_then(|l| l.split("]]").next()) == Some(name)) {
            return format!("`{name}` is a list of tables: write each entry as [[{name}]], with two brackets");
        }
        return format!("the table [{name}] is written twice; put its keys under one [{name}]");
    }
    match line.split_once('=') {
        Some((key, _)) => format!("`{}` is set twice in the same table; keep one", key.trim()),
        None => "a key or table is written twice".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::syntax;

    #[test]
    fn syntax_errors_say_what_was_meant() {
        for (text, want) in [
            (
                "[server]\nlisten = 127.0.0.1:8080\n",
                ":2:15: TOML syntax error: invalid float, expected nothing; a text goes in quotes: listen = \"...\"",
            ),
            ("[[routes]]\nname = x\n", "a text goes in quotes: name = \"...\""),
            ("[server]\n  listen   =  0.0.0.0:1\n", "a text goes in quotes: listen = \"...\""),
            (
                "[server]\nlisten: \"127.0.0.1:1\"\n",
                ":2:9: TOML syntax error: key with no value, expected `=`; TOML joins a key and its value with `=`, not `:`",
            ),
            ("[server]\naccess_log = True\n", "a boolean is written true or false, in lower case (access_log = true)"),
            (
                "[server]\nlisten = \"a\"\nlisten = \"b\"\n",
                ":3:1: TOML syntax error: duplicate key; `listen` is set twice in the same table; keep one",
            ),
            ("[server]\n[server]\n", "the table [server] is written twice; put its keys under one [server]"),
            ("[upstreams.a]\nurl = 'x'\n[upstreams.a]\n", "the table [upstreams.a] is written twice"),
            (
                "[[routes]]\nname = 'a'\n[routes]\nname = 'b'\n",
                "`routes` is a list of tables: write each entry as [[routes]], with two brackets",
            ),
            (
                "[routes]\nname = 'a'\n[[routes]]\nname = 'b'\n",
                "[routes] is a table above, so [[routes]] (a list's entry) cannot follow it",
            ),
        ] {
            let e = syntax("f.toml", text).expect(text).to_string();
            assert!(e.contains(want), "{text}: wanted {want:?} in {e}");
        }
        // A value that may be a secret is never repeated.
        let e = syntax("f.toml", "[rate_limit_store]\npassword = hunter2 x\n").unwrap().to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
