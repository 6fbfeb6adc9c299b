//! The agent's structure, measured (issue 19): stage folders in a declared layer order, every
//! import pointing down or within its folder, no import circle between files, few loose files
//! and no long file.
//!
//! It reads `agent/src/**/*.rs` as text (no root, no build of the agent needed): comments, string
//! literals and `#[cfg(test)]` items are blanked out (a file's test module is its tail by
//! convention; `tests.rs` and `*_tests.rs` files are test code and skipped), then every path that
//! names a module of the crate is resolved to the file it names: `crate::...` paths in `use`
//! lines (groups `use crate::{a::b, c}` included) and inline, `super::` and `self::` paths, a
//! folder's `use child::...`, and inline paths through a name a `use` line brought in. The layer
//! list is the `layers:` line at the top of `agent/src/lib.rs` (bottom first, `<` between).
//!
//! The same blanked text gives every production function's length (agent, agentctl, console and
//! the wire crate: at most [`MAX_FN_LINES`], from the `fn` line to the closing brace; files a
//! `#[cfg(test)] mod` brings in are test code too), and the string literals of the agent's
//! production code, none of which may name an action outside `ActionKind::as_str` (issue 37).
//! The same imports show what the fronts (`cli/`, `server/`) reach: the engine, model and the
//! exceptions ARCHITECTURE.md lists, nothing else (issue 37). ARCHITECTURE.md's tree is held to
//! the code in [`tree`] (issue 37).
//!
//! Run with `--nocapture` to print the measured numbers. `BLOCKJANITOR_STRUCTURE_ROOT` points it
//! at another checkout (to measure an older tree).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[path = "structure/tree.rs"]
mod tree;

/// Most loose files allowed at the top of `agent/src`.
const MAX_LOOSE: usize = 6;
/// Longest non-test source file allowed, in lines.
const MAX_LINES: usize = 600;
/// Folders whose source files are held to [`MAX_LINES`] (missing ones have no files).
const SIZED: &[&str] = &["agent", "rpc", "ctl", "console", "fuzz"];

fn root() -> PathBuf {
    match std::env::var_os("BLOCKJANITOR_STRUCTURE_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

fn is_test_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Every `.rs` file under `dir` (none when `dir` is missing), skipping build output.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                out.extend(rust_files(&p));
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The source with comments, string and char literals blanked (newlines kept, so byte offsets
/// still give line numbers).
fn blank_literals(src: &str) -> String {
    scan_literals(src).0
}

/// [`blank_literals`] of `src`, and where each string literal (raw and byte strings included,
/// quotes and all) was in it.
fn scan_literals(src: &str) -> (String, Vec<Range<usize>>) {
    let mut strings = Vec::new();
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let prev_ident = i > 0 && ident(b[i - 1]);
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !prev_ident && (b[i] == b'r' || b[i..].starts_with(b"br")) && {
            let k = if b[i] == b'r' { i + 1 } else { i + 2 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            b.get(k + hashes) == Some(&b'"')
        } {
            let k = if b[i] == b'r' { i + 1 } else { i + 2 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            let body = k + hashes + 1;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = find(b, body, &close).map_or(b.len(), |p| p + close.len());
            blank(&mut out, i, end);
            strings.push(i..end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, (j + 1).min(b.len()));
            strings.push(i..(j + 1).min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', a multi-byte char) or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| i + 2 + p + 1)
            } else {
                let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch_len) == Some(&b'\'')).then_some(i + 2 + ch_len)
            };
            match end {
                Some(e) => {
                    blank(&mut out, i, e);
                    i = e;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    (String::from_utf8(out).unwrap_or_default(), strings)
}

/// The index of the brace that closes the one at `open` (in code whose literals are blanked), or
/// the end of `b` when it is never closed.
fn closing_brace(b: &[u8], open: usize) -> usize {
    let mut depth = 0i32;
    for (j, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    b.len()
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| from + p)
}

/// Blanks every item under `#[cfg(test)]` (up to its `;`, or its matching `}`).
fn blank_test_items(code: &str) -> String {
    let mut b = code.as_bytes().to_vec();
    for span in test_items(code) {
        for c in &mut b[span] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    }
    String::from_utf8(b).unwrap_or_default()
}

/// Where every item under `#[cfg(test)]` is in `code` (literals blanked): from the attribute up
/// to the item's `;`, or its matching `}`.
fn test_items(code: &str) -> Vec<Range<usize>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find(b, from, b"#[cfg(test)]") {
        let semi = find(b, at, b";");
        let brace = find(b, at, b"{");
        let end = match (semi, brace) {
            (Some(s), Some(o)) if s < o => s + 1,
            (_, Some(o)) => (closing_brace(b, o) + 1).min(b.len()),
            (Some(s), None) => s + 1,
            (None, None) => b.len(),
        };
        out.push(at..end);
        from = end;
    }
    out
}

/// One source file of the agent library.
struct SourceFile {
    /// Path relative to `agent/src`.
    rel: String,
    /// Its module path (`discover::nvme`), empty for `lib.rs`.
    module: Vec<String>,
    /// Its code without comments, literals or test items.
    code: String,
}

impl SourceFile {
    /// The stage folder (or loose module) it belongs to.
    fn unit(&self) -> &str {
        self.module.first().map_or("lib", String::as_str)
    }
}

fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].bytes().filter(|&c| c == b'\n').count() + 1
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses a path tree starting at `at` (just after `prefix::`): `a::b`, `a::{b, c::d}`, ...
/// Pushes every full path it names, each with the byte offset of its first segment.
fn parse_tree(code: &str, at: usize, prefix: &[String], out: &mut Vec<(Vec<String>, usize)>) -> usize {
    let b = code.as_bytes();
    let mut i = at;
    let mut path = prefix.to_vec();
    let skip_ws = |mut i: usize| {
        while i < b.len() && (b[i] as char).is_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                i = skip_ws(i);
                if i >= b.len() {
                    return i;
                }
                if b[i] == b'}' {
                    return i + 1;
                }
                if b[i] == b',' {
                    i += 1;
                    continue;
                }
                let next = parse_tree(code, i, &path, out);
                i = if next == i { i + 1 } else { next };
            }
        }
        let start = i;
        if code[i..].starts_with("r#") {
            i += 2;
        }
        let seg_start = i;
        while i < b.len() && is_ident(b[i] as char) {
            i += 1;
        }
        if i == seg_start {
            if path.len() > prefix.len() || b.get(i) == Some(&b'*') {
                out.push((path, start));
            }
            return i;
        }
        let seg = &code[seg_start..i];
        if seg != "self" {
            path.push(seg.to_owned());
        }
        let after = skip_ws(i);
        if code[after..].starts_with("::") && !code[after + 2..].trim_start().starts_with('<') {
            i = after + 2;
            continue;
        }
        out.push((path, start));
        return i;
    }
}

/// The crate's modules, each with its file.
struct Crate {
    files: Vec<SourceFile>,
    by_module: HashMap<Vec<String>, usize>,
}

impl Crate {
    /// The file a full module-relative path names: the longest prefix that is a module.
    fn resolve(&self, path: &[String]) -> Option<usize> {
        (0..=path.len()).rev().find_map(|n| self.by_module.get(&path[..n]).copied())
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.by_module.contains_key(path)
    }
}

/// One import from a file to another: the target file and the line it is named on.
struct Import {
    to: usize,
    line: usize,
}

/// Every import of file `f`.
fn imports(krate: &Crate, f: usize) -> Vec<Import> {
    let file = &krate.files[f];
    let code = &file.code;
    let parent: Vec<String> = file.module[..file.module.len().saturating_sub(1)].to_vec();
    let mut paths: Vec<(Vec<String>, usize)> = Vec::new();
    let mut aliases: HashMap<String, Vec<String>> = HashMap::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    for (n, &(at, _)) in chars.iter().enumerate() {
        if n > 0 && (is_ident(chars[n - 1].1) || chars[n - 1].1 == ':') {
            continue;
        }
        let rest = &code[at..];
        let (base, skip): (Vec<String>, usize) = if rest.starts_with("crate::") {
            (Vec::new(), 7)
        } else if rest.starts_with("super::") {
            // `super::super::` climbs once per `super`.
            let mut base = parent.clone();
            let mut k = 7;
            while code[at + k..].starts_with("super::") {
                base.pop();
                k += 7;
            }
            (base, k)
        } else if rest.starts_with("self::") {
            (file.module.clone(), 6)
        } else {
            continue;
        };
        let mut found = Vec::new();
        parse_tree(code, at + skip, &base, &mut found);
        paths.extend(found);
    }
    // `use` statements: their names (for inline paths through them) and relative `use child::`.
    let mut from = 0;
    while let Some(p) = code[from..].find("use ") {
        let at = from + p;
        from = at + 4;
        if at > 0 && is_ident(code[..at].chars().next_back().unwrap_or(' ')) {
            continue;
        }
        let mut found = Vec::new();
        let first = code[at + 4..].trim_start();
        let first_at = code.len() - first.len();
        let head: String = first.chars().take_while(|&c| is_ident(c)).collect();
        let base = match head.as_str() {
            "crate" | "super" | "self" | "" => None,
            child if krate.is_module(&[file.module.clone(), vec![child.to_owned()]].concat()) => {
                Some(file.module.clone())
            }
            _ => None,
        };
        if let Some(base) = base {
            parse_tree(code, first_at, &base, &mut found);
            paths.extend(found.iter().cloned());
        }
        if head == "crate" || head == "super" || head == "self" {
            let mut abs = Vec::new();
            let (base, skip) = match head.as_str() {
                "crate" => (Vec::new(), 7),
                "super" => (parent.clone(), 7),
                _ => (file.module.clone(), 6),
            };
            if code[first_at..].starts_with(&format!("{head}::")) {
                parse_tree(code, first_at + skip, &base, &mut abs);
            }
            found.extend(abs);
        }
        for (path, at) in found {
            let end = code[at..].find([',', ';', '}']).map_or(code.len(), |e| at + e);
            let tail = &code[at..end];
            let name = match tail.split(" as ").nth(1) {
                Some(alias) => alias.trim().to_owned(),
                None => path.last().cloned().unwrap_or_default(),
            };
            if krate.is_module(&path) {
                aliases.insert(name, path);
            }
        }
    }
    // Inline paths through a child module or a module a `use` line named: `name::rest`.
    for (n, &(at, c)) in chars.iter().enumerate() {
        if !is_ident(c) || (n > 0 && (is_ident(chars[n - 1].1) || chars[n - 1].1 == ':')) {
            continue;
        }
        let name: String = code[at..].chars().take_while(|&c| is_ident(c)).collect();
        if !code[at + name.len()..].starts_with("::") || matches!(name.as_str(), "crate" | "super" | "self") {
            continue;
        }
        let base = match aliases.get(&name) {
            Some(p) => p.clone(),
            None => {
                let child = [file.module.clone(), vec![name.clone()]].concat();
                if !krate.is_module(&child) {
                    continue;
                }
                child
            }
        };
        let mut found = Vec::new();
        parse_tree(code, at + name.len() + 2, &base, &mut found);
        if found.is_empty() {
            found.push((base, at));
        }
        paths.extend(found.into_iter().map(|(p, _)| (p, at)));
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (path, at) in paths {
        let Some(to) = krate.resolve(&path) else { continue };
        let line = line_of(code, at);
        if to != f && krate.files[to].rel != "lib.rs" && seen.insert((to, line)) {
            out.push(Import { to, line });
        }
    }
    out
}

/// The declared layer order: the `layers:` line of lib.rs's module doc, bottom first.
fn layers(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim_start_matches("//!").trim().strip_prefix("layers:").map(str::to_owned))
        .flat_map(|l| l.split('<').map(|s| s.trim().to_owned()).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(n: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct T<'a> {
        edges: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        let targets: Vec<usize> = t.edges.get(&v).into_iter().flatten().copied().collect();
        for w in targets {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The library of the crate whose sources are `src` (its `bin/` left out), test code skipped.
fn load_crate(src: &Path) -> Crate {
    let mut files = Vec::new();
    for p in rust_files(src) {
        let rel = p.strip_prefix(src).expect("under src").to_path_buf();
        if is_test_file(&p) || rel.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read a source file");
        files.push(SourceFile {
            rel: rel.to_string_lossy().into_owned(),
            module: module_of(&rel),
            code: blank_test_items(&blank_literals(&text)),
        });
    }
    assert!(!files.is_empty(), "no source files under {}", src.display());
    let by_module = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
    Crate { files, by_module }
}

/// Every import circle between the files of `krate` (whose sources are `shown`/), one message
/// each naming every import that closes it, and the number of file-to-file imports.
fn circle_offences(krate: &Crate, shown: &str) -> (Vec<String>, usize) {
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut lines: HashMap<(usize, usize), usize> = HashMap::new();
    for f in 0..krate.files.len() {
        for imp in imports(krate, f) {
            edges.entry(f).or_default().insert(imp.to);
            lines.entry((f, imp.to)).or_insert(imp.line);
        }
    }
    let mut out = Vec::new();
    for scc in circles(krate.files.len(), &edges) {
        let mut msg = String::from("import circle:");
        for &a in &scc {
            for &b in edges.get(&a).into_iter().flatten() {
                if scc.contains(&b) {
                    let _ = write!(
                        msg,
                        "\n    {shown}/{}:{} -> {shown}/{}",
                        krate.files[a].rel,
                        lines[&(a, b)],
                        krate.files[b].rel
                    );
                }
            }
        }
        out.push(msg);
    }
    (out, edges.values().map(BTreeSet::len).sum())
}

#[test]
fn the_agent_is_layered_without_circles_loose_files_or_long_files() {
    let root = root();
    let src = root.join("agent/src");
    let krate = load_crate(&src);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let order = layers(&lib);
    let rank = |unit: &str| order.iter().position(|l| l == unit);

    let mut offences = Vec::new();
    let units: BTreeSet<&str> = krate.files.iter().map(SourceFile::unit).filter(|u| *u != "lib").collect();
    if order.is_empty() {
        offences.push("agent/src/lib.rs: no `//! layers: a < b < ...` line".to_owned());
    }
    for u in &units {
        if !order.is_empty() && rank(u).is_none() {
            offences.push(format!("agent/src/{u}: not in the layer list of lib.rs"));
        }
    }

    let mut unit_arrows = BTreeSet::new();
    let mut back_up = 0;
    for f in 0..krate.files.len() {
        for imp in imports(&krate, f) {
            let (a, b) = (krate.files[f].unit(), krate.files[imp.to].unit());
            if a == b || a == "lib" {
                continue;
            }
            unit_arrows.insert((a, b));
            if let (Some(ra), Some(rb)) = (rank(a), rank(b)) {
                if rb > ra {
                    back_up += 1;
                    offences.push(format!(
                        "agent/src/{}:{}: {a} imports {b} (agent/src/{}), a layer above it",
                        krate.files[f].rel, imp.line, krate.files[imp.to].rel
                    ));
                }
            }
        }
    }
    let (found_circles, file_arrows) = circle_offences(&krate, "agent/src");
    offences.extend(found_circles.iter().cloned());

    let loose: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|p| p.parent() == Some(src.as_path()))
        .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
        .collect();
    if loose.len() > MAX_LOOSE {
        offences.push(format!(
            "agent/src: {} loose files (at most {MAX_LOOSE}): {}",
            loose.len(),
            loose.join(" ")
        ));
    }

    let mut longest = (0, String::new());
    for dir in SIZED {
        for p in rust_files(&root.join(dir)) {
            let rel = p.strip_prefix(&root).unwrap_or(&p).to_string_lossy().into_owned();
            if is_test_file(&p) || rel.contains("/generated/") || rel.contains("/proto/") {
                continue;
            }
            let n = std::fs::read_to_string(&p).map(|t| t.lines().count()).unwrap_or(0);
            if n > longest.0 {
                longest = (n, rel.clone());
            }
            if n > MAX_LINES {
                offences.push(format!("{rel}:{n}: {n} lines (at most {MAX_LINES})"));
            }
        }
    }

    let folders = units.iter().filter(|u| src.join(u).is_dir()).count();
    println!("layers: {}", order.join(" < "));
    println!("stage folders: {folders}");
    println!("files (agent/src, non-test): {}", krate.files.len());
    println!("arrows between folders: {} ({} file-to-file imports)", unit_arrows.len(), file_arrows);
    println!("back-up arrows: {back_up}");
    println!("import circles between files: {}", found_circles.len());
    println!("loose files: {} ({})", loose.len(), loose.join(" "));
    println!("longest file: {} lines ({})", longest.0, longest.1);
    assert!(offences.is_empty(), "{} structure offences:\n{}", offences.len(), offences.join("\n"));
}

/// The other crates' libraries have no import circle between their files either.
#[test]
fn no_other_crate_has_an_import_circle() {
    let root = root();
    let mut offences = Vec::new();
    for krate in ["rpc", "ctl", "console"] {
        let src = root.join(krate).join("src");
        if !src.is_dir() {
            continue;
        }
        let (found, arrows) = circle_offences(&load_crate(&src), &format!("{krate}/src"));
        println!("{krate}: {arrows} file-to-file imports, {} import circles", found.len());
        offences.extend(found);
    }
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

/// agentctl (the `blockjanitor-ctl` crate), the console and the wire crate they share build
/// without the agent: `cargo tree` of each lists no `blockjanitor` package.
#[test]
fn agentctl_and_the_console_do_not_depend_on_the_agent() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for package in ["blockjanitor-ctl", "blockjanitor-console", "blockjanitor-rpc"] {
        let out = std::process::Command::new(&cargo)
            .args(["tree", "--offline", "--locked", "-e", "normal,build", "--prefix", "none", "-p", package])
            .current_dir(root())
            .output()
            .expect("run cargo tree");
        let tree = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(tree.lines().any(|l| l.starts_with(package)), "cargo tree -p {package} names it: {tree}");
        let agent: Vec<&str> = tree.lines().filter(|l| l.starts_with("blockjanitor v")).collect();
        assert!(agent.is_empty(), "{package} depends on the agent crate: {agent:?}");
        println!("{package}: {} packages, none of them the agent", tree.lines().count());
    }
}

/// Longest production function allowed, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 100;
/// Source folders whose production functions are held to [`MAX_FN_LINES`].
const FN_SIZED: &[&str] = &["agent/src", "ctl/src", "console/src", "rpc/src"];

/// The files among `files` that a `#[cfg(test)] mod name;` brings in (by its `#[path]` when it
/// has one): test code whatever their name.
fn cfg_test_module_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for p in files {
        let Ok(text) = std::fs::read_to_string(p) else { continue };
        let code = blank_literals(&text);
        let dir = p.parent().unwrap_or(Path::new(""));
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let children =
            if matches!(stem, "mod" | "lib" | "main") { dir.to_path_buf() } else { dir.join(stem) };
        for span in test_items(&code) {
            let item = code[span.clone()].trim_end();
            let Some(head) = item.strip_suffix(';') else { continue };
            let Some(name) = head.rsplit_once("mod ").map(|(_, n)| n.trim()) else { continue };
            let raw = &text[span];
            let path = raw.split("#[path").nth(1).and_then(|a| a.split('"').nth(1));
            match path {
                Some(path) => {
                    out.insert(dir.join(path));
                }
                None => {
                    out.insert(children.join(format!("{name}.rs")));
                    out.insert(children.join(name).join("mod.rs"));
                }
            }
        }
    }
    out
}

/// The production source files under `dir`: not `tests.rs`/`*_tests.rs`, nor brought in by a
/// `#[cfg(test)]` module; each with its text.
fn production_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let files = rust_files(dir);
    let test_modules = cfg_test_module_files(&files);
    files
        .into_iter()
        .filter(|p| !is_test_file(p) && !test_modules.contains(p))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read a source file");
            (p, text)
        })
        .collect()
}

/// One function with a body.
struct Function {
    name: String,
    /// The line of its `fn` keyword.
    line: usize,
    /// Its lines, from the `fn` line to the line of its closing brace.
    lines: usize,
    /// Where its body is (braces included).
    body: Range<usize>,
}

/// Every function with a body in `code` (comments, literals and test items blanked), nested ones
/// included. The signature ends at the first `{` or `;` outside brackets.
fn functions(code: &str) -> Vec<Function> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find(b, from, b"fn") {
        from = at + 2;
        if (at > 0 && ident(b[at - 1])) || !b.get(at + 2).is_some_and(u8::is_ascii_whitespace) {
            continue;
        }
        let rest = code[at + 2..].trim_start();
        let name: String = rest.trim_start_matches("r#").chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() {
            continue;
        }
        let (mut depth, mut j) = (0i32, code.len() - rest.len() + name.len());
        while j < b.len() {
            match b[j] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b'{' | b';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if b.get(j) != Some(&b'{') {
            continue;
        }
        let open = j;
        let j = closing_brace(b, open);
        let line = line_of(code, at);
        let lines = line_of(code, j.min(b.len())) - line + 1;
        out.push(Function { name, line, lines, body: open..(j + 1).min(b.len()) });
    }
    out
}

/// No production function of the agent, agentctl, the console or the wire crate is longer than
/// [`MAX_FN_LINES`]: a long one is split by its steps into named functions.
#[test]
fn no_production_function_is_over_100_lines() {
    let root = root();
    let mut offences = Vec::new();
    let mut longest = (0, String::new());
    let mut measured = 0;
    for dir in FN_SIZED {
        for (p, text) in production_files(&root.join(dir)) {
            let rel = p.strip_prefix(&root).unwrap_or(&p).to_string_lossy().into_owned();
            for f in functions(&blank_test_items(&blank_literals(&text))) {
                measured += 1;
                let Function { name, line, lines, .. } = f;
                if lines > longest.0 {
                    longest = (lines, format!("{rel}:{line} {name}"));
                }
                if lines > MAX_FN_LINES {
                    offences.push(format!("{rel}:{line} {name} ({lines} lines)"));
                }
            }
        }
    }
    println!("production functions: {measured}; longest: {} lines ({})", longest.0, longest.1);
    assert!(measured > 100, "only {measured} production functions found: is the root right?");
    assert!(
        offences.is_empty(),
        "{} production functions over {MAX_FN_LINES} lines (split them by their steps):\n{}",
        offences.len(),
        offences.join("\n")
    );
}

/// The action words of `ActionKind`, read from the string literals of its `as_str` in
/// `plan/step.rs` (`ActionKind::DetachMount => "detach_mount"`), and where that function's body is.
fn action_words(step_rs: &str) -> (Vec<String>, Range<usize>) {
    let (code, strings) = scan_literals(step_rs);
    let as_str = functions(&code)
        .into_iter()
        .find(|f| {
            let before = &code[..f.body.start];
            f.name == "as_str"
                && before.rfind("impl ").is_some_and(|i| before[i..].starts_with("impl ActionKind"))
        })
        .expect("agent/src/plan/step.rs has an `as_str` in `impl ActionKind`");
    let words: Vec<String> = strings
        .iter()
        .filter(|s| as_str.body.contains(&s.start))
        .filter(|s| code[..s.start].trim_end().ends_with("=>"))
        .map(|s| step_rs[s.start + 1..s.end - 1].to_owned())
        .collect();
    (words, as_str.body)
}

/// `word` in `text` with no identifier character on either side.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back().is_some_and(is_ident);
        let after = text[at + word.len()..].chars().next().is_some_and(is_ident);
        !before && !after
    })
}

/// An action's name is spelled once, by [`ActionKind`]'s `as_str` in `agent/src/plan/step.rs`:
/// no string literal of the agent's production code holds one (`"dm_remove"`, `"{dev}: dm_remove"`);
/// journals, audit lines and metrics name an action through its kind.
#[test]
fn no_action_name_is_a_string_literal_outside_its_type() {
    let root = root();
    let src = root.join("agent/src");
    let step_path = src.join("plan/step.rs");
    let step_rs = std::fs::read_to_string(&step_path).expect("read agent/src/plan/step.rs");
    let (words, as_str) = action_words(&step_rs);
    assert!(words.len() >= 2, "no action words read from ActionKind::as_str: {words:?}");
    println!("action words: {}", words.join(" "));
    let mut offences = Vec::new();
    for (p, text) in production_files(&src) {
        let rel = p.strip_prefix(&root).unwrap_or(&p).to_string_lossy().into_owned();
        let (code, strings) = scan_literals(&text);
        let tests = test_items(&code);
        for s in strings {
            let in_tests = tests.iter().any(|t| t.contains(&s.start));
            let in_as_str = p == step_path && as_str.contains(&s.start);
            if in_tests || in_as_str {
                continue;
            }
            let literal = &text[s.clone()];
            for w in words.iter().filter(|w| has_word(literal, w)) {
                offences.push(format!("{rel}:{}: {literal} names action {w}", line_of(&text, s.start)));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "{} string literals name an action (use ActionKind::as_str or Action::name):\n{}",
        offences.len(),
        offences.join("\n")
    );
}

/// The fronts of the agent (issue 37): their files may import, of the agent's own folders, only
/// the engine, `model` and their own folder (and the `blockjanitor-rpc` crate, outside this
/// count); anything else is an exception listed in ARCHITECTURE.md.
const FRONTS: &[&str] = &["cli", "server"];
/// The folders every front may import.
const FRONT_DOORS: &[&str] = &["engine", "model"];
/// The heading of ARCHITECTURE.md's list of the fronts' exceptions.
const EXCEPTIONS_HEADING: &str = "### What the fronts import besides the engine";

/// One allowed exception: files under `from` (a front's folder or one file, `cli/serve.rs`) may
/// import the modules under `to` (`daemon`, `server::listen`).
struct Exception {
    from: String,
    to: Vec<String>,
    used: bool,
}

/// The exceptions ARCHITECTURE.md lists under [`EXCEPTIONS_HEADING`], one an item:
/// ``- `FROM → TO`: the reason`` (the reason may go on over indented lines); an item without a
/// reason is an offence.
fn front_exceptions(doc: &str, offences: &mut Vec<String>) -> Vec<Exception> {
    let Some(at) = doc.find(EXCEPTIONS_HEADING) else {
        offences.push(format!("ARCHITECTURE.md: no section `{EXCEPTIONS_HEADING}`"));
        return Vec::new();
    };
    let section = &doc[at + EXCEPTIONS_HEADING.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    let mut items: Vec<String> = Vec::new();
    for line in section.lines() {
        match items.last_mut() {
            _ if line.starts_with("- `") => items.push(line[3..].to_owned()),
            Some(item) if line.starts_with("  ") => item.push_str(line),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for item in &items {
        let Some((pair, reason)) = item.split_once('`') else { continue };
        let Some((from, to)) = pair.split_once('→') else { continue };
        if reason.trim_start_matches(':').trim().is_empty() {
            offences.push(format!("ARCHITECTURE.md: the exception `{pair}` gives no reason"));
        }
        let to = to.trim().split("::").map(str::to_owned).collect();
        out.push(Exception { from: from.trim().to_owned(), to, used: false });
    }
    out
}

/// What a front imports of one folder: file-to-file imports, and import sites (file and line).
#[derive(Default)]
struct FrontFigures {
    pairs: BTreeSet<(usize, usize)>,
    sites: BTreeSet<(usize, usize)>,
}

/// The fronts' files import only the engine, model and their own folder, besides the exceptions
/// ARCHITECTURE.md lists; every listed exception is still used (the list and the code agree).
#[test]
fn the_fronts_import_only_the_engine_model_and_rpc() {
    let root = root();
    let krate = load_crate(&root.join("agent/src"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let mut offences = Vec::new();
    let mut exceptions = front_exceptions(&doc, &mut offences);
    let mut figures: BTreeMap<(&str, &str), FrontFigures> = BTreeMap::new();
    for (f, file) in krate.files.iter().enumerate().filter(|(_, file)| FRONTS.contains(&file.unit())) {
        for imp in imports(&krate, f) {
            let target = &krate.files[imp.to];
            let (front, folder) = (file.unit(), target.unit());
            if folder == front {
                continue;
            }
            let entry = figures.entry((front, folder)).or_default();
            entry.pairs.insert((f, imp.to));
            entry.sites.insert((f, imp.line));
            if FRONT_DOORS.contains(&folder) {
                continue;
            }
            let allowed = exceptions.iter_mut().find(|e| {
                (file.rel == e.from || file.rel.starts_with(&format!("{}/", e.from)))
                    && target.module.starts_with(&e.to)
            });
            match allowed {
                Some(e) => e.used = true,
                None => offences.push(format!(
                    "agent/src/{}:{}: imports {} (agent/src/{}), neither the engine nor model nor an exception of ARCHITECTURE.md",
                    file.rel,
                    imp.line,
                    target.module.join("::"),
                    target.rel
                )),
            }
        }
    }
    for e in exceptions.iter().filter(|e| !e.used) {
        offences.push(format!(
            "ARCHITECTURE.md: the exception `{} → {}` is used by no import",
            e.from,
            e.to.join("::")
        ));
    }
    for front in FRONTS {
        let rows: Vec<_> = figures.iter().filter(|((f, _), _)| f == front).collect();
        let pairs: usize = rows.iter().map(|(_, n)| n.pairs.len()).sum();
        println!("{front}: imports {} folders, {pairs} file-to-file imports", rows.len());
        for ((_, folder), n) in rows {
            println!(
                "  {folder:<10} {:>3} file-to-file imports, {:>3} import sites",
                n.pairs.len(),
                n.sites.len()
            );
        }
    }
    assert!(offences.is_empty(), "{} front import offences:\n{}", offences.len(), offences.join("\n"));
}
