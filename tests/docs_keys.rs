//! Every key the configuration accepts in `[server]`, `[metrics]`,
//! `[tracing]`, an upstream and a route is documented where the docs say
//! every key is: a row of docs/configuration.md's tables and a line of
//! config/gateway.toml. The keys are those the loader itself lists when it
//! refuses an unknown one, so a key added to the code and not to the docs
//! fails here.

use gateway::config::{self, Source};

/// The keys of the table `toml` puts `zzzz` in, as the loader lists them.
fn keys(toml: &str) -> Vec<String> {
    let source = Source::Inline { text: toml.to_owned(), base_dir: std::env::temp_dir() };
    let err = config::load(&source).expect_err(toml).to_string();
    let list = err.split("the keys here are ").nth(1).unwrap_or_else(|| panic!("{toml}: {err}"));
    list.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The keys named in the first cell of the rows of configuration.md whose
/// first key starts with `prefix` (a row may name several: `a` / `b`).
fn documented(doc: &str, prefix: &str) -> Vec<String> {
    doc.lines()
        .filter(|l| l.starts_with(&format!("| `{prefix}")))
        .flat_map(|l| {
            let cell = l[2..].split(" | ").next().unwrap_or_default();
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(|k| k.strip_prefix(prefix).unwrap_or(k).to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether config/gateway.toml sets or shows `key` (`key = `, commented
/// out or not, inside an inline table or a sentence), or opens its table
/// (`[server.tls]`).
fn shown(example: &str, key: &str) -> bool {
    let set = format!("{key} =");
    example.lines().any(|l| {
        let l = l.trim_start_matches(['#', ' ']);
        l.starts_with(&set) || l.contains(&format!(" {set}")) || l.contains(&format!(".{key}]"))
    })
}

#[test]
fn every_key_is_in_the_reference_and_the_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let example = std::fs::read_to_string(root.join("config/gateway.toml")).unwrap();
    let route = "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\nzzzz = 1\n";
    let tables = [
        ("[server]\nzzzz = 1\n", "server."),
        ("[metrics]\nzzzz = 1\n", "metrics."),
        ("[tracing]\nzzzz = 1\n", "tracing."),
        ("[upstreams.a]\nurl = 'http://127.0.0.1:1'\nzzzz = 1\n", "upstreams.NAME."),
        (route, "routes[]."),
    ];
    let mut missing = Vec::new();
    for (toml, prefix) in tables {
        let listed = keys(toml);
        assert!(listed.len() >= 2, "{toml}: {listed:?}");
        let rows = documented(&doc, prefix);
        for key in listed {
            // A table may be documented by its members' rows.
            if !rows.iter().any(|r| *r == key || r.starts_with(&format!("{key}."))) {
                missing.push(format!("configuration.md: {prefix}{key}"));
            }
            if !shown(&example, &key) {
                missing.push(format!("gateway.toml: {prefix}{key}"));
            }
        }
    }
    assert!(missing.is_empty(), "keys the loader takes and the docs do not show:\n{}", missing.join("\n"));
}
