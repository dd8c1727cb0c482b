//! The crate's modules import one another one way. At the top level, every `crate::` path
//! points down the layers of `docs/architecture.md` (`server` → `proxy` → `app`, `pool`,
//! `capacity`, `pins`, `upstream` → `captcha`, `failover`, `health`, `config`): no module
//! calls back up. Within any directory of `src/`, no two sibling modules reach each other
//! through `super::`, directly or round a longer loop; shared pieces are leaf modules that
//! both sides import (`captcha/request_error.rs`, `config/problems.rs`). Test code is left
//! out: a test may import what it checks.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Module name → the sibling modules its non-test code names through `super::`.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The names `source` reaches as `super::name`, including inside `use super::{a, b::c}`.
fn super_names(source: &str) -> BTreeSet<String> {
    names_after(source, "super::")
}

/// The first segment of every path that follows `prefix` in `source`'s non-test code,
/// including each path of a `prefix{a, b::c}` group.
fn names_after(source: &str, prefix: &str) -> BTreeSet<String> {
    let code = match source.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &source[..at],
        None => source,
    };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        let listed = match rest.strip_prefix('{') {
            // Only the first segment of each listed path names a module.
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(|path| path.trim().split("::").next().unwrap_or_default())
                .collect(),
            None => vec![rest],
        };
        for path in listed {
            let name: String = path
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// The graph of one directory's modules, `(module name, its source)` each.
fn graph(modules: &[(String, String)]) -> Graph {
    let known: BTreeSet<&str> = modules.iter().map(|(name, _)| name.as_str()).collect();
    modules
        .iter()
        .map(|(name, source)| {
            let siblings = super_names(source)
                .into_iter()
                .filter(|used| used != name && known.contains(used.as_str()))
                .collect();
            (name.clone(), siblings)
        })
        .collect()
}

/// Every loop of the graph, each as the path that closes it (`a → b → a`).
fn loops(graph: &Graph) -> Vec<Vec<String>> {
    fn walk(graph: &Graph, path: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
        let last = path.last().expect("a path is never empty").clone();
        for next in graph.get(&last).into_iter().flatten() {
            if let Some(start) = path.iter().position(|seen| seen == next) {
                // Reported once, from its smallest member.
                let looped = &path[start..];
                if looped.iter().min() == Some(&looped[0]) {
                    let mut closed = looped.to_vec();
                    closed.push(next.clone());
                    found.push(closed);
                }
            } else {
                path.push(next.clone());
                walk(graph, path, found);
                path.pop();
            }
        }
    }
    let mut found = Vec::new();
    for start in graph.keys() {
        walk(graph, &mut vec![start.clone()], &mut found);
    }
    found.sort();
    found.dedup();
    found
}

/// `(directory, its modules)` for every directory under `src/` that holds `.rs` files. A
/// module is `x.rs` in the directory; `tests.rs` is test code and left out.
fn directories(root: &Path) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let mut modules = Vec::new();
        for entry in fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("src is readable").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                if name != "tests" {
                    let source = fs::read_to_string(&path).expect("a source file is UTF-8");
                    modules.push((name, source));
                }
            }
        }
        out.push((dir.display().to_string(), modules));
    }
    out
}

#[test]
fn no_two_sibling_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let dirs = directories(&src);
    // The walk found the directories this rule was written for.
    for expected in ["captcha", "config", "proxy"] {
        assert!(
            dirs.iter().any(|(dir, _)| dir.ends_with(expected)),
            "no src/{expected}"
        );
    }
    // The top level (`crate::` paths) is not this test's business; `super::` from a file
    // directly in src/ would name the crate root.
    let found: Vec<(String, Vec<Vec<String>>)> = dirs
        .iter()
        .filter(|(dir, _)| Path::new(dir) != src)
        .map(|(dir, modules)| (dir.clone(), loops(&graph(modules))))
        .filter(|(_, loops)| !loops.is_empty())
        .collect();
    assert!(
        found.is_empty(),
        "sibling modules import each other: {found:?}"
    );
}

#[test]
fn the_loop_finder_sees_direct_and_longer_loops_and_only_those() {
    let module = |name: &str, source: &str| (name.to_owned(), source.to_owned());
    // Today's captcha arrows, one way: no loop.
    let one_way = [
        module(
            "request",
            "use super::{json_body, multipart};\nuse super::request_error::RequestError;",
        ),
        module(
            "multipart",
            "use super::request_error::RequestError;\nuse super::param_name::{php_name, spells};",
        ),
        module("json_body", "use super::request_error::RequestError;"),
        module("request_error", "use std::fmt;"),
        module("param_name", ""),
    ];
    assert!(loops(&graph(&one_way)).is_empty());

    // The shape before the leaf existed: request ↔ multipart, through a use and a path.
    let direct = [
        module("request", "use super::{json_body, multipart};"),
        module(
            "multipart",
            "fn f() -> super::request::RequestError { todo!() }",
        ),
        module("json_body", ""),
    ];
    assert_eq!(
        loops(&graph(&direct)),
        [["multipart", "request", "multipart"]]
    );

    // A longer loop, a parent import (`super::Config`, not a sibling) and test-only imports.
    let longer = [
        module(
            "keys",
            "use super::validate::a_type;\nuse super::{Config, DEFAULT_WEIGHT};",
        ),
        module("validate", "use super::summary::line;"),
        module(
            "summary",
            "use super::keys::pool;\n#[cfg(test)]\nmod tests {\n    use super::super::validate;\n}",
        ),
    ];
    assert_eq!(
        loops(&graph(&longer)),
        [["keys", "validate", "summary", "keys"]]
    );
    let tests_only = [
        module("a", "use super::b::x;"),
        module(
            "b",
            "#[cfg(test)]\nmod tests {\n    use super::super::a::x;\n}",
        ),
    ];
    assert!(loops(&graph(&tests_only)).is_empty());
}

/// The top-level modules, bottom first: a module may name (`crate::x`) only modules of a
/// lower layer. Modules of one layer do not name each other. A module missing here fails
/// the test below, so a new one must be given its place.
const LAYERS: &[&[&str]] = &[
    // Vocabulary shared by everything.
    &[
        "api_key",
        "key_id",
        "fast_map",
        "host",
        "provider",
        "log_limit",
        "atomic_file",
    ],
    // The protocol of either generation, the validated config, and provider health: pure
    // or behind a narrow store.
    &["captcha", "json_api", "config", "outage"],
    // Key health, behind a narrow store; its reasons name the protocol's codes.
    &["health"],
    // The policy, pure; and the simulator, which speaks only the protocol.
    &["failover", "sim"],
    // Pure figures for autoscalers: the scaling formula and the balance forecast.
    &["scaling", "forecast"],
    // The caller token table: config resolved to key ids; and what each token spends.
    &["tokens", "budgets"],
    // Compact task tables; the upstream client and its account reads; certificates.
    &["task_table", "upstream", "tls"],
    // Task pins, and the polling cadence and kept answers of each task.
    &["pins", "polling"],
    &["capacity"],
    // The shared pool on Redis: leases, pins, health and readings of several replicas.
    &["cluster"],
    &["pool"],
    &["registry", "metrics"],
    // The bottom of the request path: the shared handle.
    &["app"],
    &["status", "refresh"],
    // May a submit take a thread of a key: the ticket that becomes an open task.
    &["admission"],
    // A cluster replica's heartbeat and sync, which may run a refresh.
    &["fleet"],
    // The admin API: served by `proxy` (and so `server`), acting through `app` and `refresh`.
    &["admin"],
    &["proxy", "reload"],
    // Every long-running background task, started by `server`.
    &["background"],
    &["server"],
    // Binaries' commands: the demo, `keyrelay ctl`, the admin API's client, and
    // `keyrelay check --online`, the upstream's word on every key.
    &["demo", "ctl", "online_check"],
];

/// The binary's root (`main.rs`) and its modules (`cli.rs` with `cli/`, its subcommands).
const BINARY: &[&str] = &["main", "cli"];

/// `crate::` roots re-exported at the crate's root, and the modules they come from.
const ROOT_EXPORTS: [(&str, &str); 3] =
    [("ApiKey", "api_key"), ("App", "app"), ("Config", "config")];

/// The top-level modules `source` names through `crate::`, including in `use crate::{a, b}`,
/// with the crate root's re-exports read as the modules they come from.
fn crate_names(source: &str) -> BTreeSet<String> {
    names_after(source, "crate::")
        .into_iter()
        .map(|name| {
            ROOT_EXPORTS
                .iter()
                .find(|(export, _)| *export == name)
                .map_or(name, |(_, module)| (*module).to_owned())
        })
        .collect()
}

/// Each top-level module (`src/x.rs` with everything under `src/x/`) and the other
/// top-level modules its non-test code names.
fn top_level(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for (dir, modules) in directories(src) {
        let relative = Path::new(&dir)
            .strip_prefix(src)
            .expect("under src")
            .to_path_buf();
        for (name, source) in modules {
            let top = match relative.components().next() {
                Some(first) => first.as_os_str().to_string_lossy().into_owned(),
                None => name.clone(),
            };
            // The binary is another crate: its `crate::` paths name `main.rs`'s items, and
            // it may use any of the library's modules.
            if top == "lib" || BINARY.contains(&top.as_str()) {
                continue;
            }
            let named = graph.entry(top.clone()).or_default();
            named.extend(crate_names(&source).into_iter().filter(|n| *n != top));
        }
    }
    graph
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn top_level_modules_point_down_the_layers_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = top_level(&src);
    for expected in ["proxy", "app", "captcha", "failover"] {
        assert!(graph.contains_key(expected), "no module {expected}");
    }
    let mut upward = Vec::new();
    for (module, named) in &graph {
        let Some(layer) = layer_of(module) else {
            panic!("src/{module} has no place in LAYERS; give it one");
        };
        for other in named {
            match layer_of(other) {
                Some(below) if below < layer => {}
                Some(_) => upward.push(format!("{module} -> {other}")),
                // Not a module: a root item such as a macro.
                None => {}
            }
        }
    }
    assert!(
        upward.is_empty(),
        "these imports point up or across the layers: {upward:?}"
    );
    assert!(loops(&graph).is_empty(), "{:?}", loops(&graph));
}

#[test]
fn the_crate_path_reader_sees_groups_paths_and_root_exports() {
    let named = crate_names(
        "use crate::{app::App, captcha};\nuse crate::pool::KeyEntry;\nfn f(k: &crate::ApiKey) {}\n\
         #[cfg(test)]\nmod tests {\n    use crate::proxy;\n}",
    );
    let want: BTreeSet<String> = ["app", "captcha", "pool", "api_key"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(named, want);
    assert_eq!(
        layer_of("proxy").map(|l| l > layer_of("app").unwrap()),
        Some(true)
    );
    assert_eq!(layer_of("nothing"), None);
}
