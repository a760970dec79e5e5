//! The kernel-call lint (issue 37): agent code outside `agent/src/kernel/` reaches the kernel only through the
//! seam's traits (`agent/src/kernel/mod.rs`). A path that names aya's maps, programs, links or loader, `libc`,
//! `nix` or netlink directly — in a `use`, in code, or inside a macro's arguments — fails the lint, unless its
//! file is one of [`EXCEPTIONS`], each with the reason it may. An exception whose file is gone or no longer
//! calls the kernel fails too, so the list stays true.

use std::{
    fmt, fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// Where the kernel-facing code lives (relative to the workspace): the only folder the lint does not scan.
const KERNEL_DIR: &str = "agent/src/kernel/";

/// The agent's sources the lint scans.
const AGENT_SRC: &str = "agent/src";

/// Paths agent code outside `kernel/` may not name, each with what it reaches. A trailing `*` matches any
/// segment that starts with what precedes it.
const FORBIDDEN: &[(&str, &str)] = &[
    ("aya::maps", "aya's map API"),
    ("aya::programs", "aya's program and link API"),
    ("aya::Ebpf", "aya's object loader"),
    ("aya::EbpfLoader", "aya's object loader"),
    ("aya::sys", "aya's raw syscalls"),
    ("libc", "a raw libc call"),
    ("nix", "a nix syscall wrapper"),
    ("rtnetlink", "netlink"),
    ("netlink_packet_*", "netlink messages"),
    ("netlink_sys", "netlink sockets"),
];

/// The files outside `kernel/` allowed to call the kernel directly (relative to the workspace), each with why.
const EXCEPTIONS: &[(&str, &str)] = &[
    (
        "agent/src/main.rs",
        "restores SIGPIPE's default disposition (libc::signal) before anything runs: process set-up, no kernel state",
    ),
    (
        "agent/src/memory.rs",
        "libc::malloc_trim hands the allocator's free pages back: an allocator call, no kernel state weir owns",
    ),
    (
        "agent/src/config/mod.rs",
        "nix::unistd::gethostname gives the default node name while the configuration is read, before any seam exists",
    ),
    (
        "agent/src/calc/bench.rs",
        "a cfg(test) benchmark reading the thread's CPU time (nix::time); measures, touches no kernel state",
    ),
    (
        "agent/src/observe/ebpf_log.rs",
        "the debug object's log drain: aya-log takes aya's ProgramInfo handles; no seam trait, debug builds only",
    ),
];

/// One direct kernel call outside `kernel/`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    path: String,
    what: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` reaches the kernel directly ({}) outside {KERNEL_DIR}; move this call behind a trait in \
             {KERNEL_DIR} or add an exception with a reason to EXCEPTIONS in xtask/src/kernel_calls.rs",
            self.file, self.line, self.path, self.what
        )
    }
}

/// Runs the lint over the workspace's agent sources.
pub(crate) fn run(ws: &Path) -> Result<()> {
    let mut files = Vec::new();
    rust_files(&ws.join(AGENT_SRC), &mut files)?;
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(ws)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        let source =
            fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        found.extend(violations(&rel, &source)?);
    }
    let existing = |rel: &str| ws.join(rel).is_file();
    let problems = judge(&found, EXCEPTIONS, existing);
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "the kernel-call lint found {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    )
}

/// Every `*.rs` file under `dir`, recursively, sorted (shared with the layer lint).
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot list {}", dir.display()))?
            .path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The direct kernel calls in one file (`rel`: its path from the workspace root). Files under `kernel/` have none
/// by definition.
fn violations(rel: &str, source: &str) -> Result<Vec<Violation>> {
    if rel.starts_with(KERNEL_DIR) {
        return Ok(Vec::new());
    }
    let file = syn::parse_file(source)
        .with_context(|| format!("the kernel-call lint cannot parse {rel}"))?;
    let mut paths = Paths::default();
    paths.visit_file(&file);
    let mut out: Vec<Violation> = paths
        .found
        .into_iter()
        .filter_map(|(segments, line)| {
            forbidden(&segments).map(|what| Violation {
                file: rel.to_owned(),
                line,
                path: segments.join("::"),
                what,
            })
        })
        .collect();
    out.sort_by_key(|v| v.line);
    out.dedup();
    Ok(out)
}

/// What a path reaches, if it is one of [`FORBIDDEN`].
fn forbidden(segments: &[String]) -> Option<&'static str> {
    FORBIDDEN.iter().find_map(|(pattern, what)| {
        let pattern: Vec<&str> = pattern.split("::").collect();
        let matches = pattern.len() <= segments.len()
            && pattern
                .iter()
                .zip(segments)
                .all(|(p, s)| match p.strip_suffix('*') {
                    Some(prefix) => s.starts_with(prefix),
                    None => p == s,
                });
        matches.then_some(*what)
    })
}

/// Every violation not covered by an exception, and every exception that is stale (file gone, or clean now).
fn judge(
    found: &[Violation],
    exceptions: &[(&str, &str)],
    exists: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems: Vec<String> = found
        .iter()
        .filter(|v| !exceptions.iter().any(|(file, _)| *file == v.file))
        .map(ToString::to_string)
        .collect();
    for (file, _) in exceptions {
        if !exists(file) {
            problems.push(format!(
                "{file}: listed in EXCEPTIONS of xtask/src/kernel_calls.rs but no such file; remove or correct the entry"
            ));
        } else if !found.iter().any(|v| v.file == *file) {
            problems.push(format!(
                "{file}: listed in EXCEPTIONS of xtask/src/kernel_calls.rs but calls the kernel no more; remove the entry"
            ));
        }
    }
    problems
}

/// Collects every path in a file with its line: `use` trees expanded, paths in code, and `a::b` sequences in
/// macro arguments.
#[derive(Default)]
struct Paths {
    found: Vec<(Vec<String>, usize)>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push_use(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.push_use(prefix, &r.ident),
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.found.push((prefix.clone(), line));
            }
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
        self.found.push((segments, ident.span().start().line));
    }

    fn tokens(&mut self, tokens: TokenStream) {
        let mut current: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        let flush =
            |current: &mut Vec<String>, line: usize, found: &mut Vec<(Vec<String>, usize)>| {
                if !current.is_empty() {
                    found.push((std::mem::take(current), line));
                }
            };
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) => {
                    if colons != 2 {
                        flush(&mut current, line, &mut self.found);
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
                    flush(&mut current, line, &mut self.found);
                    colons = 0;
                    self.tokens(g.stream());
                }
                _ => {
                    flush(&mut current, line, &mut self.found);
                    colons = 0;
                }
            }
        }
        flush(&mut current, line, &mut self.found);
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.found.push((segments, line));
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

    fn paths_of(rel: &str, source: &str) -> Vec<(String, usize)> {
        violations(rel, source)
            .expect("parses")
            .into_iter()
            .map(|v| (v.path, v.line))
            .collect()
    }

    #[test]
    fn direct_calls_outside_kernel_are_found_with_their_line() {
        let source = "\
use aya::maps::HashMap;
use aya::{programs::{SchedClassifier, Xdp}, Pod};
// aya::maps in a comment is no call
fn f() -> bool {
    let _ = \"libc::in_a_string\";
    let _ = nix::unistd::gethostname();
    matches!(e, aya::maps::MapError::PinError { .. })
}
fn g() { unsafe { libc::malloc_trim(0) }; rtnetlink::new_connection(); }
use netlink_packet_route::link::LinkMessage;
";
        assert_eq!(
            paths_of("agent/src/dataplane/x.rs", source),
            vec![
                ("aya::maps::HashMap".to_owned(), 1),
                ("aya::programs::SchedClassifier".to_owned(), 2),
                ("aya::programs::Xdp".to_owned(), 2),
                ("nix::unistd::gethostname".to_owned(), 6),
                ("aya::maps::MapError::PinError".to_owned(), 7),
                ("libc::malloc_trim".to_owned(), 9),
                ("rtnetlink::new_connection".to_owned(), 9),
                ("netlink_packet_route::link::LinkMessage".to_owned(), 10),
            ]
        );
    }

    #[test]
    fn harmless_paths_pass() {
        let source = "use aya::Pod;\nuse std::os::unix::fs::PermissionsExt;\nstatic O: &[u8] = \
                      aya::include_bytes_aligned!(\"x\");\nfn f() { tokio::signal::ctrl_c(); }\n";
        assert_eq!(paths_of("agent/src/lib.rs", source), vec![]);
    }

    #[test]
    fn kernel_folder_is_not_scanned() {
        let source = "use aya::maps::HashMap;\n";
        assert_eq!(paths_of("agent/src/kernel/real/x.rs", source), vec![]);
        assert_eq!(paths_of("agent/src/kernelish.rs", source).len(), 1);
    }

    #[test]
    fn a_violation_fails_with_file_line_and_the_fix_unless_excepted() {
        let found = violations("agent/src/dataplane/x.rs", "use libc::signal;\n").expect("parses");
        let problems = judge(&found, &[], |_| true);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("agent/src/dataplane/x.rs:1: `libc::signal`"));
        assert!(problems[0].contains("move this call behind a trait in agent/src/kernel/"));
        assert!(problems[0].contains("add an exception with a reason"));

        let excepted = [("agent/src/dataplane/x.rs", "a reason")];
        assert_eq!(judge(&found, &excepted, |_| true), Vec::<String>::new());
    }

    #[test]
    fn stale_exceptions_fail() {
        let clean = [("agent/src/clean.rs", "a reason")];
        let problems = judge(&[], &clean, |_| true);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("calls the kernel no more"));
        let problems = judge(&[], &clean, |_| false);
        assert!(problems[0].contains("no such file"));
    }

    #[test]
    fn the_real_exception_list_names_files_with_reasons() {
        for (file, reason) in EXCEPTIONS {
            assert!(
                file.starts_with("agent/src/") && !file.starts_with(KERNEL_DIR),
                "{file}"
            );
            assert!(reason.len() > 20, "{file} needs a reason");
        }
    }
}
