//! The layer lint (issue 37): each top-level folder of `agent/src/` is a layer, and a file may name (`use
//! crate::…`, or a `crate::x::…` path in code or in a macro's arguments) only its own layer's code and the
//! layers below it in [`LAYERS`]. Since the order is strict, any import cycle between layers has an edge
//! going up, which fails the lint unless it is one of [`ALLOWED`], each with the reason it may. An allowed
//! edge no file uses any more fails too, so the list stays true.
//!
//! Test code is not a dependency: items under `#[cfg(test)]` and files declared by a `#[cfg(test)] mod x;`
//! are not read (tests may build whatever fixture they need). The `weir` binary (`main.rs`, `cli/`) is the
//! top and its `crate::` is its own crate, so it is not read either. `super::` paths stay inside a layer
//! in this code base and are not read.

use std::{collections::BTreeSet, fmt, fs, path::Path};

use anyhow::{Context as _, Result, bail};
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// The agent's library sources.
const AGENT_SRC: &str = "agent/src";

/// The layers, bottom up: each row is one rank, the names its top-level modules (a folder, or a file at
/// the root); a file may import its own rank and the ranks above it in this list. The order follows the
/// flow of ARCHITECTURE.md: the kernel seam, the dataplane's drivers over it, the desired state, the loop
/// that owns the node, the sources that feed it, and what reads its snapshots.
pub(crate) const LAYERS: &[(&[&str], &str)] = &[
    (
        &["paths", "fsutil", "fasthash", "memory", "logging", "attach"],
        "leaf helpers: paths and names, atomic files, the integer hasher, the allocator, logging, the attach crate",
    ),
    (&["kernel"], "the seam: traits, real/, fake/, migrate/"),
    (
        &["setup"],
        "the host outside BPF: sysctls, the conflist, uninstall",
    ),
    (&["dataplane"], "managers and drivers over the seam"),
    (
        &["config"],
        "the validated configuration, parsed into the drivers' types",
    ),
    (
        &["calc"],
        "desired state: identities, policy, Services, pod IPAM",
    ),
    (
        &["cluster"],
        "the cluster's nodes: records, their store, routes",
    ),
    (
        &["control"],
        "the loop: the node, its deltas, the applier, the snapshot",
    ),
    (&["sources"], "what tells the loop what the node should be"),
    (&["observe"], "trace, drop monitor, metrics, counters"),
    (&["api"], "the agent API on its unix socket"),
    (
        &[
            "daemon",
            "upkeep",
            "synthetic",
            "testing",
            "inprocess",
            "lib",
        ],
        "the wiring of `weir agent`, its upkeep tasks, and the test tiers' agents",
    ),
];

/// Imports that go up a layer, each with why it may (for now). `from`: a file or folder under `agent/src/`;
/// `to`: the start of the imported path after `crate::`.
pub(crate) const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "dataplane/services.rs",
        "calc::services",
        "ServiceMaps runs the incremental Service calculation (its Tracker) next to its map drivers; \
         splitting the two is the next step of issue 37",
    ),
    (
        "calc/reference.rs",
        "sources::registry",
        "the reference compile reads the endpoint registry from disk, as the node does (below)",
    ),
    (
        "control/node.rs",
        "sources::registry",
        "the node persists its endpoints in the registry, which is its store rather than a source; \
         it moves to control/ when the loop's sources are reorganised (branch loopdrv edits sources/)",
    ),
    (
        "control/applier.rs",
        "observe::trace",
        "the loop answers a trace request on its own thread, since it owns the node the trace reads",
    ),
    (
        "control/applier.rs",
        "observe::ktrace",
        "and adds the kernel's half of that trace (BPF_PROG_TEST_RUN) there, beside the node",
    ),
];

/// An import that goes up a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    path: String,
    from: String,
    to: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{AGENT_SRC}/{}:{}: `crate::{}` goes up from layer {} to layer {} (bottom up: {}); move what it \
             names down to {} or below (an API body to weir-api), or add an entry with a reason to ALLOWED \
             in xtask/src/layers.rs",
            self.file,
            self.line,
            self.path,
            self.from,
            self.to,
            order(),
            self.from,
        )
    }
}

/// The layer order, for messages.
fn order() -> String {
    LAYERS
        .iter()
        .map(|(names, _)| names.join("/"))
        .collect::<Vec<_>>()
        .join(" < ")
}

/// The rank of a top-level module, if it is in [`LAYERS`].
fn rank(name: &str) -> Option<usize> {
    LAYERS.iter().position(|(names, _)| names.contains(&name))
}

/// Runs the lint over the workspace's agent sources.
pub(crate) fn run(ws: &Path) -> Result<()> {
    let root = ws.join(AGENT_SRC);
    let mut files = Vec::new();
    crate::kernel_calls::rust_files(&root, &mut files)?;
    let mut sources = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        let source =
            fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        sources.push((rel, source));
    }
    let problems = check(&sources, ALLOWED)?;
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "the layer lint found {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    )
}

/// The top-level module a file belongs to (`rel`: its path under `agent/src/`).
fn layer_of(rel: &str) -> &str {
    match rel.split_once('/') {
        Some((folder, _)) => folder,
        None => rel.strip_suffix(".rs").unwrap_or(rel),
    }
}

/// True for the `weir` binary's files (`main.rs`, `cli/`).
fn is_binary(rel: &str) -> bool {
    rel == "main.rs" || rel.starts_with("cli/")
}

/// Every problem in `sources` ((path under `agent/src/`, text) of each file): imports going up, top-level
/// modules missing from [`LAYERS`], and entries of `allowed` no import uses.
fn check(sources: &[(String, String)], allowed: &[(&str, &str, &str)]) -> Result<Vec<String>> {
    let mut parsed = Vec::new();
    for (rel, source) in sources {
        if is_binary(rel) {
            continue;
        }
        let file = syn::parse_file(source)
            .with_context(|| format!("the layer lint cannot parse {AGENT_SRC}/{rel}"))?;
        parsed.push((rel.as_str(), file));
    }
    // The modules declared under `#[cfg(test)]`, and (to a fixed point) every module a test file declares.
    let mut test_files: Vec<String> = parsed
        .iter()
        .flat_map(|(rel, file)| test_modules(rel, file, false))
        .collect();
    loop {
        let more: Vec<String> = parsed
            .iter()
            .filter(|(rel, _)| test_files.iter().any(|t| rel.starts_with(t.as_str())))
            .flat_map(|(rel, file)| test_modules(rel, file, true))
            .filter(|m| !test_files.contains(m))
            .collect();
        if more.is_empty() {
            break;
        }
        test_files.extend(more);
    }
    let is_test = |rel: &str| test_files.iter().any(|t| rel.starts_with(t.as_str()));

    let mut problems = Vec::new();
    let mut unknown = BTreeSet::new();
    let mut used = vec![false; allowed.len()];
    for (rel, file) in &parsed {
        if is_test(rel) {
            continue;
        }
        let from = layer_of(rel);
        let Some(from_rank) = rank(from) else {
            unknown.insert(from.to_owned());
            continue;
        };
        let mut paths = CratePaths::default();
        paths.visit_file(file);
        for (segments, line) in paths.found {
            let Some(to) = segments.first() else { continue };
            let to_rank = rank(to).unwrap_or(LAYERS.len() - 1);
            if to_rank <= from_rank {
                continue;
            }
            let path = segments.join("::");
            let allow = allowed.iter().position(|(file, prefix, _)| {
                rel.starts_with(file) && starts_with_segments(&segments, prefix)
            });
            if let Some(i) = allow {
                used[i] = true;
                continue;
            }
            problems.push(
                Violation {
                    file: (*rel).to_owned(),
                    line,
                    path,
                    from: from.to_owned(),
                    to: to.clone(),
                }
                .to_string(),
            );
        }
    }
    problems.dedup();
    for name in unknown {
        problems.push(format!(
            "{AGENT_SRC}/{name}: a top-level module in no layer; add it to LAYERS in xtask/src/layers.rs"
        ));
    }
    for ((file, to, _), used) in allowed.iter().zip(used) {
        if !used {
            problems.push(format!(
                "{AGENT_SRC}/{file} → crate::{to}: listed in ALLOWED of xtask/src/layers.rs but no such import \
                 goes up any more; remove the entry"
            ));
        }
    }
    Ok(problems)
}

/// True when `segments` start with the `::`-separated `prefix`.
fn starts_with_segments(segments: &[String], prefix: &str) -> bool {
    let prefix: Vec<&str> = prefix.split("::").collect();
    prefix.len() <= segments.len() && prefix.iter().zip(segments).all(|(p, s)| p == s)
}

/// True for `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string() == "test")
    })
}

/// The files (paths under `agent/src/`, or folder prefixes ending in `/`) of the modules `file` declares
/// under `#[cfg(test)]` (`all`: every module it declares, for a file that is test code itself).
fn test_modules(rel: &str, file: &syn::File, all: bool) -> Vec<String> {
    let (dir, stem) = match rel.rsplit_once('/') {
        Some((dir, name)) => (format!("{dir}/"), name.trim_end_matches(".rs")),
        None => (String::new(), rel.trim_end_matches(".rs")),
    };
    let module_dir = if matches!(stem, "mod" | "lib" | "main") {
        dir.clone()
    } else {
        format!("{dir}{stem}/")
    };
    let mut out = Vec::new();
    for item in &file.items {
        let syn::Item::Mod(m) = item else { continue };
        if m.content.is_some() || !(all || is_cfg_test(&m.attrs)) {
            continue;
        }
        let path_attr = m.attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        });
        match path_attr {
            Some(path) => out.push(format!("{dir}{path}")),
            None => {
                let name = m.ident.to_string();
                out.push(format!("{module_dir}{name}.rs"));
                out.push(format!("{module_dir}{name}/"));
            }
        }
    }
    out
}

/// The attributes of an item (those that can carry `#[cfg(test)]`).
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Collects the segments after `crate::` of every path outside test code, with its line.
#[derive(Default)]
struct CratePaths {
    found: Vec<(Vec<String>, usize)>,
}

impl CratePaths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push_use(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.push_use(prefix, &r.ident),
            syn::UseTree::Glob(g) => self.push(prefix, g.star_token.spans[0].start().line),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn push_use(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut segments = prefix.to_vec();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        self.push(&segments, ident.span().start().line);
    }

    /// Records `segments` when they start with `crate` and name something in it.
    fn push(&mut self, segments: &[String], line: usize) {
        if segments.len() > 1 && segments[0] == "crate" {
            self.found.push((segments[1..].to_vec(), line));
        }
    }

    /// `crate :: a :: b` sequences in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut current: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        let flush = |current: &mut Vec<String>, line: usize, this: &mut Self| {
            this.push(current, line);
            current.clear();
        };
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) => {
                    if colons != 2 {
                        flush(&mut current, line, self);
                        line = ident.span().start().line;
                    }
                    current.push(ident.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' => {
                    colons = if p.spacing() == Spacing::Joint || colons == 1 {
                        colons + 1
                    } else {
                        0
                    };
                }
                TokenTree::Group(g) => {
                    flush(&mut current, line, self);
                    colons = 0;
                    self.tokens(g.stream());
                }
                _ => {
                    flush(&mut current, line, self);
                    colons = 0;
                }
            }
        }
        flush(&mut current, line, self);
    }
}

impl<'ast> Visit<'ast> for CratePaths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_cfg_test(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_cfg_test(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.push(&segments, line);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(rel, src)| ((*rel).to_owned(), (*src).to_owned()))
            .collect()
    }

    #[test]
    fn a_cycle_between_layers_is_reported_at_its_upward_edge() {
        let sources = files(&[
            (
                "control/node.rs",
                "use crate::calc::identity::Identities;\npub struct Node;\n",
            ),
            (
                "calc/identity.rs",
                "pub struct Identities;\nfn f() {\n    let _ = crate::control::node::Node;\n}\n",
            ),
        ]);
        let problems = check(&sources, &[]).expect("parses");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "agent/src/calc/identity.rs:3: `crate::control::node::Node` goes up from layer calc to layer control"
            ),
            "{}",
            problems[0]
        );
        assert!(problems[0].contains("add an entry with a reason to ALLOWED"));
    }

    #[test]
    fn imports_down_and_within_a_layer_pass() {
        let sources = files(&[
            (
                "control/node.rs",
                "use crate::{control::deltas, calc::x, dataplane::{plane::Dataplane, map_driver}, kernel::*, paths};\n",
            ),
            ("daemon.rs", "use crate::{api::server, upkeep};\n"),
            ("main.rs", "use crate::cli::x;\n"),
            ("cli/mod.rs", "use agent::daemon;\n"),
        ]);
        assert_eq!(check(&sources, &[]).expect("parses"), Vec::<String>::new());
    }

    #[test]
    fn an_allowed_edge_passes_and_a_stale_one_fails() {
        let sources = files(&[(
            "cluster/setup.rs",
            "fn f(n: &mut crate::control::node::Node) { tracing::info!(x = ?crate::control::node::X); }\n",
        )]);
        let allowed = [("cluster/setup.rs", "control::node", "a reason")];
        assert_eq!(
            check(&sources, &allowed).expect("parses"),
            Vec::<String>::new()
        );

        let narrower = [("cluster/setup.rs", "control::applier", "a reason")];
        let problems = check(&sources, &narrower).expect("parses");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("`crate::control::node::Node` goes up"));
        assert!(problems[1].contains("`crate::control::node::X` goes up"));
        assert!(problems[2].contains("no such import goes up any more"));
    }

    #[test]
    fn macro_arguments_are_read() {
        let sources = files(&[(
            "kernel/real/x.rs",
            "fn f() { assert!(crate::dataplane::plane::ok()); }\n",
        )]);
        let problems = check(&sources, &[]).expect("parses");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("from layer kernel to layer dataplane"));
    }

    #[test]
    fn test_code_is_not_read() {
        let sources = files(&[
            (
                "calc/mod.rs",
                "#[cfg(test)]\nmod equivalence;\n#[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod tests;\n\
                 #[cfg(test)]\nmod inline { use crate::api::server; }\n#[cfg(any(test, feature = \"testing\"))]\n\
                 pub mod testkit;\n",
            ),
            ("calc/x_tests.rs", "use crate::observe::trace;\n"),
            ("calc/testkit.rs", "use crate::control::node::Node;\n"),
            (
                "calc/equivalence.rs",
                "#[path = \"eq_more.rs\"]\nmod more;\nuse crate::control::node::Node;\n",
            ),
            ("calc/eq_more.rs", "use crate::api::server;\n"),
        ]);
        let problems = check(&sources, &[]).expect("parses");
        assert_eq!(
            problems.len(),
            1,
            "only the testing feature's code counts: {problems:?}"
        );
        assert!(problems[0].starts_with("agent/src/calc/testkit.rs:1:"));
    }

    #[test]
    fn a_module_in_no_layer_fails() {
        let sources = files(&[("newthing/mod.rs", "pub fn f() {}\n")]);
        let problems = check(&sources, &[]).expect("parses");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("newthing: a top-level module in no layer"));
    }

    #[test]
    fn the_real_tables_are_well_formed() {
        let mut seen = BTreeSet::new();
        for (names, what) in LAYERS {
            assert!(!what.is_empty());
            for name in *names {
                assert!(seen.insert(*name), "{name} is in two layers");
            }
        }
        for (file, to, reason) in ALLOWED {
            let from = rank(layer_of(file)).expect("an allowed edge starts in a layer");
            let up = to
                .split("::")
                .next()
                .and_then(rank)
                .expect("and ends in one");
            assert!(up > from, "{file} → {to} does not go up: no entry needed");
            assert!(reason.len() > 20, "{file} → {to} needs a reason");
        }
    }
}
