//! The Markdown checks of `cargo xtask lint`: in every tracked `*.md` file, no line over
//! [`LINE_LIMIT`] bytes (tables included), and every relative link names a file or
//! directory that exists.

use std::{
    fs,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The longest line a Markdown file may hold, in bytes: stricter than characters (an arrow or a
/// box-drawing character counts three), and what the project's own checker measures.
pub(crate) const LINE_LIMIT: usize = 200;

/// Checks every Markdown file `git ls-files` lists in the workspace `ws`.
pub(crate) fn run(ws: &Path) -> Result<()> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--", "*.md"])
        .current_dir(ws)
        .output()
        .context("cannot run `git ls-files`: the Markdown lint needs git and a checkout")?;
    if !out.status.success() {
        bail!(
            "`git ls-files` failed ({}): run the lint inside the weir checkout",
            out.status
        );
    }
    let listed =
        String::from_utf8(out.stdout).context("`git ls-files` printed a non-UTF-8 path")?;
    let mut problems = Vec::new();
    let mut checked = 0usize;
    for name in listed.split('\0').filter(|name| !name.is_empty()) {
        let path = ws.join(name);
        if !path.exists() {
            // Deleted in the work tree but not yet in the index: nothing to read.
            continue;
        }
        let text = fs::read_to_string(&path)
            .with_context(|| format!("cannot read {name} as UTF-8 text"))?;
        problems.extend(long_lines(name, &text));
        problems.extend(broken_links(Path::new(name), &text, |target| {
            ws.join(target).exists()
        }));
        checked += 1;
    }
    for problem in &problems {
        println!("{problem}");
    }
    if !problems.is_empty() {
        bail!(
            "{} Markdown problem(s) in {checked} file(s), listed above",
            problems.len()
        );
    }
    println!(
        "markdown: {checked} file(s), every line ≤ {LINE_LIMIT} bytes, every relative link resolves"
    );
    Ok(())
}

/// One `FILE:LINE: …` message per line of `text` longer than [`LINE_LIMIT`] bytes.
fn long_lines(name: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter_map(|(index, line)| {
            let bytes = line.len();
            (bytes > LINE_LIMIT).then(|| {
                format!(
                    "{name}:{}: {bytes} bytes (limit {LINE_LIMIT}): move the detail into the doc it links",
                    index + 1
                )
            })
        })
        .collect()
}

/// One `FILE:LINE: …` message per relative link of `text` (the file `name`, relative to the
/// workspace) whose target `exists` does not find. Targets are resolved against the file's
/// directory (or the workspace root when they start with `/`) and normalised before `exists`
/// sees them; links inside code (fenced blocks and inline spans) are not links.
fn broken_links(name: &Path, text: &str, exists: impl Fn(&Path) -> bool) -> Vec<String> {
    let dir = name.parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    let mut fence: Option<&str> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if let Some(open) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) {
            fence = Some(open);
            continue;
        }
        for target in link_targets(&without_code_spans(line)) {
            let Some(path) = local_path(&target) else {
                continue;
            };
            let resolved = match path.strip_prefix('/') {
                Some(from_root) => normalise(Path::new(from_root)),
                None => normalise(&dir.join(path)),
            };
            let found = resolved.as_ref().is_some_and(|resolved| exists(resolved));
            if !found {
                problems.push(format!(
                    "{}:{}: link to `{target}` names no file in the repository: fix the path or drop the link",
                    name.display(),
                    index + 1
                ));
            }
        }
    }
    problems
}

/// `line` with the contents of its inline code spans (`` `…` ``) removed.
fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join("``")
}

/// The targets of the inline links (`[text](target)`) and reference definitions
/// (`[label]: target`) on one line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if let Some((label, rest)) = trimmed.strip_prefix('[').and_then(|t| t.split_once("]:"))
        && !label.is_empty()
        && let Some(target) = rest.split_whitespace().next()
    {
        targets.push(target.trim_matches(['<', '>']).to_owned());
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let target = match after.strip_prefix('<') {
            Some(angled) => angled.split('>').next().unwrap_or_default(),
            None => after
                .split(|c: char| c == ')' || c.is_whitespace())
                .next()
                .unwrap_or_default(),
        };
        targets.push(target.to_owned());
        rest = after;
    }
    targets
}

/// The file part of a link target, or `None` when the target is not a local file (a URL, a
/// mail address, an anchor in the same file, or empty).
fn local_path(target: &str) -> Option<&str> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let path = target.split(['#', '?']).next().unwrap_or_default();
    (!path.is_empty()).then_some(path)
}

/// `path` with `.` and `..` resolved lexically; `None` when it climbs out of the workspace.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_limit_is_reported_with_its_file_line_and_length() {
        let long = "a".repeat(LINE_LIMIT + 1);
        let text = format!("# title\n\n{long}\n");
        assert_eq!(
            long_lines("docs/x.md", &text),
            vec![format!(
                "docs/x.md:3: {} bytes (limit {LINE_LIMIT}): move the detail into the doc it links",
                LINE_LIMIT + 1
            )]
        );
    }

    #[test]
    fn a_line_at_the_limit_passes_and_multibyte_characters_count_as_bytes() {
        let text = format!("{}\n| a | b |\n", "a".repeat(LINE_LIMIT));
        assert_eq!(long_lines("README.md", &text), Vec::<String>::new());
        // 100 two-byte characters and one more byte: 201 bytes, over the limit.
        let wide = format!("{}a", "é".repeat(LINE_LIMIT / 2));
        assert_eq!(long_lines("README.md", &wide).len(), 1);
    }

    fn existing(paths: &'static [&'static str]) -> impl Fn(&Path) -> bool {
        move |path| paths.iter().any(|known| Path::new(known) == path)
    }

    #[test]
    fn a_relative_link_to_a_missing_file_is_reported() {
        let text = "intro\n\nsee [the guide](gone.md#setup) and [ok](../README.md)\n";
        assert_eq!(
            broken_links(Path::new("docs/a.md"), text, existing(&["README.md"])),
            vec![
                "docs/a.md:3: link to `gone.md#setup` names no file in the repository: \
                 fix the path or drop the link"
                    .to_owned()
            ]
        );
    }

    #[test]
    fn a_link_climbing_out_of_the_repository_is_reported() {
        let text = "[design](../shared/DESIGN.md)\n";
        assert_eq!(
            broken_links(Path::new("README.md"), text, |_| true).len(),
            1,
            "a target outside the workspace cannot resolve, whatever exists"
        );
    }

    #[test]
    fn existing_targets_urls_anchors_and_code_pass() {
        let text = "\
[arch](ARCHITECTURE.md), [tests](tests/README.md#tiers), [dir](docs/), [root](/docs/cni.md)
[web](https://example.com/x.md) [mail](mailto:a@b.c) [here](#status)
`[not a link](missing.md)`

```md
[not a link either](missing.md)
```
[ref]: docs/cni.md
";
        let ok = existing(&["ARCHITECTURE.md", "tests/README.md", "docs", "docs/cni.md"]);
        assert_eq!(
            broken_links(Path::new("README.md"), text, ok),
            Vec::<String>::new()
        );
        // The positive control: the same checker finds the fenced link once it is outside code.
        assert_eq!(
            broken_links(
                Path::new("README.md"),
                "[not a link either](missing.md)\n",
                |_| false
            )
            .len(),
            1
        );
    }

    #[test]
    fn a_broken_reference_definition_is_reported() {
        let text = "[ref]: docs/missing.md\n";
        assert_eq!(
            broken_links(Path::new("README.md"), text, |_| false).len(),
            1
        );
    }
}
