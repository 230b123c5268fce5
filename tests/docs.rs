//! `docs/architecture.md` names files and folders of the repository in backticks; each must
//! exist, so that the map stays true as code moves.

use std::path::Path;

/// The top-level folders whose paths the docs point at.
const ROOTS: [&str; 11] = [
    "core/",
    "sim/",
    "host/",
    "python/",
    "src/",
    "docs/",
    "data/",
    "tests/",
    "benches/",
    "examples/",
    "scripts/",
];

/// The tokens between single backticks in `text`, in order, outside fenced code blocks (whose
/// lines are pictures and commands, not pointers).
fn backticked(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The repository path `token` names, if it names one: a token containing `/` that starts with
/// one of [`ROOTS`], with an item (`::name`) or a line (`:12`) after it taken off.
fn repo_path(token: &str) -> Option<&str> {
    let token = token.trim();
    let named = ROOTS.iter().any(|root| token.starts_with(root));
    if !named || token.contains(char::is_whitespace) {
        return None;
    }
    // `path::item` or `path:line`: the path is what comes before the first colon.
    let path = token.split(':').next().unwrap_or(token);
    Some(path)
}

/// Every repository path of `text` that does not exist under `root`, each once, in order.
fn missing(text: &str, root: &Path) -> Vec<String> {
    let mut gone: Vec<String> = Vec::new();
    for token in backticked(text) {
        if let Some(p) = repo_path(&token) {
            if !root.join(p).exists() && !gone.iter().any(|g| g == p) {
                gone.push(p.to_owned());
            }
        }
    }
    gone
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/architecture.md"))
        .expect("docs/architecture.md is readable");
    let tokens = backticked(&text);
    let paths: Vec<&str> = tokens.iter().filter_map(|t| repo_path(t)).collect();
    assert!(
        paths.len() >= 20,
        "docs/architecture.md names only {} repository paths in backticks",
        paths.len()
    );
    let gone = missing(&text, root);
    assert!(
        gone.is_empty(),
        "docs/architecture.md names {} path(s) that do not exist:\n  {}",
        gone.len(),
        gone.join("\n  ")
    );
}

#[test]
fn paths_are_found_with_items_and_lines_taken_off() {
    let text = "See `sim/src/cost.rs::vectorised`, `host/src/cli/:3`, `core/src/nowhere.rs`, \
                `scripts/no_such_script.sh`, `tessera_host::estimation::estimate`, \
                `--batch-size 8` and `a/b`.\n```\n`sim/src/fenced.rs`\n```\n";
    let tokens = backticked(text);
    let found: Vec<&str> = tokens.iter().filter_map(|t| repo_path(t)).collect();
    assert_eq!(
        found,
        [
            "sim/src/cost.rs",
            "host/src/cli/",
            "core/src/nowhere.rs",
            "scripts/no_such_script.sh"
        ]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(
        missing(text, root),
        ["core/src/nowhere.rs", "scripts/no_such_script.sh"]
    );
}

/// The README's table of options, between these markers, is
/// `EstimateOptions::markdown_table()`: one source for the table, `--help` and Python's help.
const TABLE_START: &str = "<!-- options: EstimateOptions::markdown_table -->\n";
const TABLE_END: &str = "<!-- /options -->";

/// The README's options table is the library's. With `TESSERA_BLESS=1` the test writes the
/// library's table into the README instead of failing.
#[test]
fn the_readme_s_options_table_is_the_library_s() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md is readable");
    let start = readme
        .find(TABLE_START)
        .expect("the README has the options table's start")
        + TABLE_START.len();
    let end = start
        + readme[start..]
            .find(TABLE_END)
            .expect("the README has the options table's end");
    let table = tessera::host::estimation::EstimateOptions::markdown_table();
    if readme[start..end] != table {
        if std::env::var_os("TESSERA_BLESS").is_some() {
            let updated = format!("{}{table}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).expect("README.md is writable");
            return;
        }
        panic!(
            "README.md's options table is not the library's; run this test with TESSERA_BLESS=1 to write it:\n{table}"
        );
    }
    // Every option is in it, under its flag.
    for h in tessera::host::estimation::EstimateOptions::help() {
        assert!(table.contains(&format!("`--{}`", h.flag)), "{}", h.flag);
    }
}
