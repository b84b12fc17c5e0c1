//! Configuration errors, and where they point: the file and line of the
//! key (or the environment variable that set it), the key's full path, and
//! what is wrong, so a newcomer can go straight to the mistake.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

mod syntax;
mod words;

/// A configuration error: where it came from, which key, and what is wrong.
#[derive(Debug)]
pub struct ConfigError {
    /// The config file's path, `embedded default`, or `environment
    /// variable NAME` when the value came from an override.
    pub source_name: String,
    /// The line (from 1) of the key in the file, where it is there.
    pub line: Option<usize>,
    /// The column (from 1), for syntax errors.
    pub column: Option<usize>,
    /// The offending key, e.g. `routes[1].timeout`; empty when the
    /// error is not about one key (a syntax error).
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    /// An error about `key` (empty: about the whole file) of `source_name`.
    pub fn new(source_name: impl Into<String>, key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            source_name: source_name.into(),
            line: None,
            column: None,
            key: key.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source_name)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(column) = self.column {
            write!(f, ":{column}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Keys that exist for the gateway's own tests and are never suggested.
const HIDDEN_KEYS: &[&str] = &["panic"];

/// A TOML syntax error in `text`, with its line and column.
pub(super) fn syntax(source_name: &str, text: &str) -> Option<ConfigError> {
    let e = DeTable::parse(text).err()?;
    let hint = e.span().and_then(|span| syntax::hint(text, e.message(), span.start));
    let message = match hint {
        Some(hint) => format!("TOML syntax error: {}; {hint}", e.message()),
        None => format!("TOML syntax error: {}", e.message()),
    };
    let mut error = ConfigError::new(source_name, "", message);
    if let Some(span) = e.span() {
        let (line, column) = line_and_column(text, span.start);
        (error.line, error.column) = (Some(line), Some(column));
    }
    Some(error)
}

/// Turns a `config` crate error into `(key, message)`: the key path with
/// every separator (the crate writes `routes[3]respond`), an unknown key
/// named in it with the closest known one suggested, and a value of the
/// wrong type said in the file's words.
pub(super) fn from_crate(e: config::ConfigError) -> (String, String) {
    let (key, message) = keyed(e);
    let message = words::plain(&key, message);
    (key, message)
}

fn keyed(e: config::ConfigError) -> (String, String) {
    match e {
        config::ConfigError::Type { key, unexpected, expected, .. } => {
            (dotted(&key.unwrap_or_default()), format!("invalid type: {unexpected}, expected {expected}"))
        }
        config::ConfigError::NotFound(key) => (dotted(&key), "missing".to_owned()),
        config::ConfigError::At { error, key, .. } => {
            let (inner, message) = keyed(*error);
            let key = dotted(&key.unwrap_or_default());
            let key = match (key.is_empty(), inner.is_empty()) {
                (_, true) => key,
                (true, false) => inner,
                (false, false) => format!("{key}.{inner}"),
            };
            (key, message)
        }
        config::ConfigError::Message(m) => match unknown_field(&m) {
            Some((field, known)) => (field.to_owned(), unknown_message(field, &known)),
            None => (String::new(), m),
        },
        other => (String::new(), other.to_string()),
    }
}

/// An upstream name with a dot written bare (`[upstreams.svc.v1]` in the
/// file's `text`) is a table `v1` inside the upstream `svc`, an unknown key
/// there: said so, with the quoting that keeps it one name.
pub(super) fn quote_dotted_name(key: &str, message: String, text: &str) -> String {
    match key.split('.').collect::<Vec<_>>()[..] {
        ["upstreams", name, rest]
            if message.starts_with("unknown key; the keys here")
                && text.contains(&format!("[upstreams.{name}.{rest}]")) =>
        {
            format!(
                "{message} (an upstream named `{name}.{rest}` is written with quotes: [upstreams.\"{name}.{rest}\"])"
            )
        }
        _ => message,
    }
}

/// The config crate joins an index and the key after it with no dot.
fn dotted(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    let mut after_index = false;
    for c in key.chars() {
        if after_index && c != '.' && c != '[' {
            out.push('.');
        }
        after_index = c == ']';
        out.push(c);
    }
    out
}

/// serde's "unknown field `x`, expected one of `a`, `b`": the field and
/// the names it lists, the hidden ones left out.
fn unknown_field(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let known = rest.split('`').skip(1).step_by(2).filter(|k| !HIDDEN_KEYS.contains(k)).collect();
    Some((field, known))
}

fn unknown_message(field: &str, known: &[&str]) -> String {
    if let Some(close) = closest(field, known) {
        return format!("unknown key; did you mean `{close}`?");
    }
    let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
    format!("unknown key; the keys here are {}", known.join(", "))
}

/// The known name nearest to `field` by edit distance (a swap of two
/// neighbours counting as one edit), when it is near enough to be a typo.
fn closest<'a>(field: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = match field.chars().count() {
        0..=3 => 1,
        4..=6 => 2,
        _ => 3,
    };
    known.iter().map(|k| (distance(&field.to_lowercase(), k), *k)).filter(|(d, _)| *d <= limit).min().map(|(_, k)| k)
}

/// Names longer than this are no typo of a known one: their distance is
/// not computed (its table grows as the product of the two lengths).
const LONGEST_TYPO: usize = 64;

/// Optimal string alignment distance; `usize::MAX` for a text longer than
/// [`LONGEST_TYPO`].
pub(super) fn distance(a: &str, b: &str) -> usize {
    if a.len() > LONGEST_TYPO || b.len() > LONGEST_TYPO {
        return usize::MAX;
    }
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// The environment variable that set `key` or a table holding it
/// (`GATEWAY__SERVER__LISTEN` for `server.listen`), among `vars`.
pub(super) fn variable_for(key: &str, vars: impl Iterator<Item = (String, String)>) -> Option<String> {
    vars.map(|(name, _)| name).find(|name| {
        let lower = name.to_lowercase();
        let Some(path) = lower.strip_prefix("gateway__") else { return false };
        let path = path.replace("__", ".");
        key == path || key.strip_prefix(path.as_str()).is_some_and(|rest| rest.starts_with(['.', '[']))
    })
}

/// The variable that set a key under `key` (`GATEWAY__SERVR__LISTEN` for
/// `servr`), among `vars`: whom to blame for an error about a key the file
/// does not hold, which only a variable can have made.
pub(super) fn variable_under(key: &str, vars: impl Iterator<Item = (String, String)>) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    vars.map(|(name, _)| name).find(|name| {
        let lower = name.to_lowercase();
        let Some(path) = lower.strip_prefix("gateway__") else { return false };
        path.replace("__", ".").strip_prefix(key).is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Whether `message` is serde's answer to a table, or a text, where a list
/// belongs: what a variable under a list (`GATEWAY__ROUTES__0__TIMEOUT`)
/// or naming one makes, since a variable's value is never read as a list.
pub(super) fn wants_a_list(message: &str) -> bool {
    message.contains(", expected a list")
}

/// What is said of a list that a variable tried to set.
pub(super) const NO_LIST_FROM_VARIABLES: &str = "is a list, and lists (routes, server.trusted_proxies and the \
     like) cannot be set from the environment, only in the file";

/// The line of `key` (`routes[3].respond.status`) in `text`, or of the
/// deepest table on its path that is there (a missing key's table); and
/// how many of `key`'s dotted segments `text` holds, from the first: fewer
/// than all when a table on its path is not in the file (a variable may
/// have made it).
pub(super) fn walk(text: &str, key: &str) -> (Option<usize>, usize) {
    let Ok(root) = DeTable::parse(text) else { return (None, 0) };
    let mut table = root.get_ref();
    let mut found: Option<Range<usize>> = None;
    let line = |found: Option<Range<usize>>| found.map(|s| line_and_column(text, s.start).0);
    let mut held = 0;
    for segment in key.split('.') {
        let (name, indices) = match segment.split_once('[') {
            Some((name, rest)) => (name, Some(rest)),
            None => (segment, None),
        };
        let Some((k, v)) = table.get_key_value(name) else { break };
        found = Some(k.span());
        let mut value = v;
        for index in indices.into_iter().flat_map(|r| r.split('[')) {
            let Ok(i) = index.trim_end_matches(']').parse::<usize>() else { return (None, held) };
            match value.get_ref() {
                DeValue::Array(items) if i < items.len() => {
                    value = &items[i];
                    found = Some(value.span());
                }
                _ => return (line(found), held),
            }
        }
        held += 1;
        match value.get_ref() {
            DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    (line(found), held)
}

/// The line and column (both from 1; the column in characters) of byte
/// `at` in `text`.
fn line_and_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_no_typo() {
        assert_eq!(distance("upstream", "upstrem"), 1);
        let long = "u".repeat(LONGEST_TYPO + 1);
        assert_eq!(distance(&long, &long), usize::MAX);
        assert_eq!(distance("upstream", &long), usize::MAX);
        assert_eq!(closest(&"v".repeat(100_000), &["upstream"]), None);
    }

    #[test]
    fn keys_keep_their_dots() {
        for (raw, want) in [
            ("routes[3]respond", "routes[3].respond"),
            ("routes[3]respond.status", "routes[3].respond.status"),
            ("routes[3].respond", "routes[3].respond"),
            ("a[1][2]b", "a[1][2].b"),
            ("server.listen", "server.listen"),
            ("", ""),
        ] {
            assert_eq!(dotted(raw), want);
        }
    }

    #[test]
    fn unknown_keys_suggest_a_close_name_and_never_a_hidden_one() {
        let serde = |f: &str| format!("unknown field `{f}`, expected one of `listen`, `idle_timeout`, `panic`");
        for (field, want) in [
            ("listne", "did you mean `listen`?"),
            ("lisen", "did you mean `listen`?"),
            ("Listen", "did you mean `listen`?"),
            ("idle_timout", "did you mean `idle_timeout`?"),
            ("pani", "the keys here are `listen`, `idle_timeout`"),
            ("zzz", "the keys here are `listen`, `idle_timeout`"),
        ] {
            let (key, message) = from_crate(config::ConfigError::Message(serde(field)));
            assert_eq!(key, field);
            assert!(message.ends_with(want), "{field}: {message}");
            assert!(!message.contains("panic"), "{message}");
        }
        let two = "unknown field `x`, expected `cert` or `key`";
        assert_eq!(unknown_field(two), Some(("x", vec!["cert", "key"])));
        assert_eq!(unknown_field("unknown field `x`, there are no fields"), Some(("x", vec![])));
    }

    #[test]
    fn lines_of_keys() {
        let text =
            "[server]\nlisten = 'x'\n\n[[routes]]\nname = 'a'\n[[routes]]\nname = 'b'\nrespond = { status = 9 }\n";
        for (key, want) in [
            ("server.listen", Some(2)),
            ("server", Some(1)),
            ("server.nothing", Some(1)),
            ("routes[1].name", Some(7)),
            ("routes[1].respond.status", Some(8)),
            ("routes[0]", Some(4)),
            ("metrics.path", None),
        ] {
            assert_eq!(walk(text, key).0, want, "{key}");
        }
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let e = syntax("f.toml", "[server]\nlisten = \n").unwrap();
        assert_eq!((e.line, e.column), (Some(2), Some(10)), "{e}");
        assert!(e.to_string().starts_with("f.toml:2:10: TOML syntax error: "), "{e}");
        assert!(syntax("f.toml", "[server]\nlisten = 'x'\n").is_none());
    }

    #[test]
    fn variables_that_set_a_key() {
        let vars = || {
            [("GATEWAY__SERVER__LISTEN", "x"), ("GATEWAY__UPSTREAMS__A__URL", "y"), ("HOME", "/")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        };
        assert_eq!(variable_for("server.listen", vars()).as_deref(), Some("GATEWAY__SERVER__LISTEN"));
        assert_eq!(variable_for("upstreams.a.url", vars()).as_deref(), Some("GATEWAY__UPSTREAMS__A__URL"));
        assert_eq!(variable_for("server.listen_x", vars()), None);
        assert_eq!(variable_for("server.idle_timeout", vars()), None);
        assert_eq!(variable_for("server", vars()), None);
        assert_eq!(variable_under("server", vars()).as_deref(), Some("GATEWAY__SERVER__LISTEN"));
        assert_eq!(variable_under("upstreams.a", vars()).as_deref(), Some("GATEWAY__UPSTREAMS__A__URL"));
        assert_eq!(variable_under("serve", vars()), None);
        assert_eq!(variable_under("server.listen", vars()), None);
        assert_eq!(variable_under("", vars()), None);
    }
}
