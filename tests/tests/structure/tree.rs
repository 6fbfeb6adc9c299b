//! ARCHITECTURE.md's tree against the code (issue 37): the fenced block under `## The tree`
//! lists folders and files, each with what it holds; this reads it and checks both ways.
//!
//! - Every entry (the names at the start of a line: `rpc/`, `  model/`, `lib.rs config.rs
//!   errors.rs`, `bench/ scripts/`) exists: a line indented by two spaces is inside the last
//!   entry at the left margin (`agent/src/`), one indented further goes on with the description.
//! - Every file (`*.rs`) and folder (`name/`) a description names exists under its entry, at
//!   any depth: `fold.rs` under `rpc/` is `rpc/src/view/fold.rs`, `kubelet/pod_dirs.rs` under
//!   `discover/` is `agent/src/discover/kubelet/pod_dirs.rs`; `*_tests.rs` matches by suffix.
//!   Names not ending in `/` or `.rs` (`pods/portforward`, `agent.proto`) are not checked.
//! - Every folder under the `src/` of each entry at the left margin (`agent/src/` is one) is an
//!   entry or named, with its path below that entry ending in the name (`view/` names
//!   `rpc/src/view`, `kubelet/pod_dirs.rs` names `agent/src/discover/kubelet`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The heading the tree's fenced block follows.
const TREE_HEADING: &str = "## The tree";

/// One entry of the tree: where it is (relative to the repository) and what its description
/// names.
#[derive(Debug)]
struct Entry {
    /// The entry's paths, relative to the repository, without a trailing `/` (one line may name
    /// several: `bench/ scripts/`).
    paths: Vec<String>,
    /// Whether the entry is at the left margin (a top-level folder, or `agent/src/`).
    top: bool,
    /// The file and folder names its description gives (folders with their trailing `/`).
    named: Vec<String>,
    /// The line of ARCHITECTURE.md the entry starts on.
    line: usize,
}

/// The lines of the fenced block under [`TREE_HEADING`], with their line numbers in the file.
fn tree_block(doc: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = doc.lines().collect();
    let Some(heading) = lines.iter().position(|l| l.trim_end() == TREE_HEADING) else {
        panic!("ARCHITECTURE.md has no `{TREE_HEADING}` section");
    };
    let open = (heading + 1..lines.len())
        .find(|&i| lines[i].starts_with("```"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md: no fenced block under `{TREE_HEADING}`"));
    let close = (open + 1..lines.len())
        .find(|&i| lines[i].starts_with("```"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md: the tree's fenced block is not closed"));
    (open + 1..close).map(|i| (i + 1, lines[i])).collect()
}

/// Whether `token` names a path: a folder (`name/`) or a Rust file (`name.rs`).
fn is_path_name(token: &str) -> bool {
    token.ends_with('/') || token.ends_with(".rs")
}

/// The file and folder names in a description: runs of path characters that end in `/` or
/// `.rs` (`view/scan.rs`, `cli/`, `*_tests.rs`), not those starting at `/` (a host path).
fn names_in(text: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '*');
    text.split(|c: char| !is_path_char(c))
        .map(|run| run.trim_end_matches('.'))
        .filter(|run| !run.starts_with('/') && run.chars().next().is_some_and(|c| c != '.'))
        .filter(|run| is_path_name(run) && run != &"/")
        .map(str::to_owned)
        .collect()
}

/// The entries of the tree's lines: a line starting at column 0 or 2 opens one (its leading
/// path names), any other line goes on with the last one's description.
fn entries(block: &[(usize, &str)]) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut parent = String::new();
    for &(line, text) in block {
        let indent = text.len() - text.trim_start().len();
        let rest = text.trim_start();
        let leading: Vec<&str> = rest.split_whitespace().take_while(|t| is_path_name(t)).collect();
        if (indent == 0 || indent == 2) && !leading.is_empty() {
            let top = indent == 0;
            let base = if top { String::new() } else { parent.clone() };
            let paths: Vec<String> =
                leading.iter().map(|t| format!("{base}{}", t.trim_end_matches('/'))).collect();
            if top {
                parent = format!("{}/", paths[0]);
            }
            let description = rest.split_whitespace().skip(leading.len()).collect::<Vec<_>>().join(" ");
            out.push(Entry { paths, top, named: names_in(&description), line });
        } else if let Some(last) = out.last_mut() {
            last.named.extend(names_in(text));
        } else {
            panic!("ARCHITECTURE.md:{line}: the tree starts with a line that is no entry: {text:?}");
        }
    }
    out
}

/// Every folder and file under `dir` (skipping build output and hidden folders, and not
/// following symbolic links: fixture trees hold `/proc`'s), as paths.
fn walk(dir: &Path, dirs: &mut Vec<PathBuf>, files: &mut Vec<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    for e in read.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "target" || name.starts_with('.') {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(p.clone());
            walk(&p, dirs, files);
        } else {
            files.push(p);
        }
    }
}

/// Whether `path` (relative to its entry, `/`-separated) ends with the components of `name`
/// (`kubelet/pod_dirs.rs`); a first component `*suffix` matches a name ending in `suffix`.
fn ends_with_name(path: &str, name: &str) -> bool {
    let have: Vec<&str> = path.split('/').collect();
    let want: Vec<&str> = name.trim_end_matches('/').split('/').collect();
    if want.len() > have.len() {
        return false;
    }
    let tail = &have[have.len() - want.len()..];
    tail.iter().zip(&want).all(|(h, w)| match w.strip_prefix('*') {
        Some(suffix) => h.ends_with(suffix),
        None => h == w,
    })
}

/// `p` relative to `base`, `/`-separated.
fn rel(p: &Path, base: &Path) -> String {
    p.strip_prefix(base).unwrap_or(p).to_string_lossy().replace('\\', "/")
}

/// Every entry of ARCHITECTURE.md's tree and every name its descriptions give exists; every
/// folder under the listed crates' `src/` (the agent's stage folders and theirs) is in the tree.
#[test]
fn architecture_tree_matches_the_code() {
    let root = super::root();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let entries = entries(&tree_block(&doc));
    let mut offences = Vec::new();
    let mut named_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut checked = 0;
    for entry in &entries {
        for path in &entry.paths {
            let full = root.join(path);
            if !full.exists() {
                offences.push(format!(
                    "ARCHITECTURE.md:{}: the tree lists `{path}`, which does not exist",
                    entry.line
                ));
            }
            named_dirs.insert(full);
        }
        // A file entry's names are beside it (`lib.rs` names `agent/src/lib.rs`).
        let first = root.join(&entry.paths[0]);
        let base = if first.is_file() { first.parent().unwrap_or(&root).to_path_buf() } else { first };
        let (mut dirs, mut files) = (Vec::new(), Vec::new());
        walk(&base, &mut dirs, &mut files);
        for name in &entry.named {
            checked += 1;
            let is_dir = name.ends_with('/');
            let found: Vec<&PathBuf> = if is_dir { dirs.iter() } else { files.iter() }
                .filter(|p| ends_with_name(&rel(p, &base), name))
                .collect();
            if found.is_empty() {
                offences.push(format!(
                    "ARCHITECTURE.md:{}: the tree names `{name}` under `{}/`, and no {} there has that name",
                    entry.line,
                    rel(&base, &root),
                    if is_dir { "folder" } else { "file" }
                ));
            }
            // The folders the name spells out (`kubelet/` of `kubelet/pod_dirs.rs`) are named.
            let depth = name.trim_end_matches('/').split('/').count() - usize::from(!is_dir);
            for p in found {
                let mut dir = if is_dir { p.clone() } else { p.parent().unwrap_or(p).to_path_buf() };
                for _ in 0..depth {
                    named_dirs.insert(dir.clone());
                    dir = dir.parent().unwrap_or(&dir).to_path_buf();
                }
            }
        }
    }
    let mut folders = 0;
    for entry in entries.iter().filter(|e| e.top) {
        for path in &entry.paths {
            let src = if path.ends_with("/src") || path == "src" {
                root.join(path)
            } else {
                root.join(path).join("src")
            };
            let (mut dirs, mut files) = (Vec::new(), Vec::new());
            walk(&src, &mut dirs, &mut files);
            for dir in dirs {
                folders += 1;
                if !named_dirs.contains(&dir) {
                    // The entry whose description should name it: the deepest one above it.
                    let above = entries
                        .iter()
                        .flat_map(|e| &e.paths)
                        .filter(|p| dir.starts_with(root.join(p)))
                        .max_by_key(|p| p.len())
                        .unwrap_or(path);
                    offences.push(format!(
                        "ARCHITECTURE.md's tree does not name the folder `{}` (an entry of its own, or `{}/` in `{above}/`'s description)",
                        rel(&dir, &root),
                        rel(&dir, &root.join(above))
                    ));
                }
            }
        }
    }
    println!(
        "ARCHITECTURE.md's tree: {} entries, {checked} names in descriptions, {folders} folders under the crates' src/",
        entries.len()
    );
    assert!(offences.is_empty(), "{} tree offences:\n{}", offences.len(), offences.join("\n"));
}

#[test]
fn a_description_names_files_and_folders_not_words() {
    assert_eq!(
        names_in("view/: the renderer (view/scan.rs, fold.rs); kubelet/pod_dirs.rs, (*_tests.rs)."),
        ["view/", "view/scan.rs", "fold.rs", "kubelet/pod_dirs.rs", "*_tests.rs"]
    );
    assert!(names_in("a pods/portforward stream, agent.proto, /run/blockjanitor/, JSON/YAML").is_empty());
    assert!(ends_with_name("src/view/fold.rs", "fold.rs"));
    assert!(ends_with_name("discover/kubelet/pod_dirs.rs", "kubelet/pod_dirs.rs"));
    assert!(!ends_with_name("discover/pod_dirs.rs", "kubelet/pod_dirs.rs"));
    assert!(ends_with_name("act/loop_tests.rs", "*_tests.rs"));
}
