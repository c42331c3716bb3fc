//! No module cycles in vramroom-load, vramroom-workload and the CLI: data flows one way, so a
//! module never reaches (directly or through others) back into one that reaches it.
//!
//! Design note: cargo-modules (`cargo modules dependencies --acyclic`) is not installed here,
//! so this reads the sources itself. A module is a file (`a/mod.rs` and `a.rs` are `a`;
//! `lib.rs`/`main.rs` the crate root); test-only modules (`#[cfg(test)] mod ...`) are left
//! out, as cargo-modules leaves them out by default. An edge `m -> n` is any path in `m`'s
//! code (a `use` tree or an inline path) that starts at `crate::`, `super::`, `self::` or a
//! child module of `m`, resolved to the longest prefix that names a module. Comments are
//! stripped first, so a doc link is no edge. A parent using its child and the child using an
//! item of its parent (`super::fmt_bytes`) is a cycle too: shared helpers go in a module of
//! their own below both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut m: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(m.last().map(String::as_str), Some("lib" | "main" | "mod")) {
        m.pop();
    }
    m
}

/// Strips `//` comments (doc comments included) and string literals' contents, so neither
/// makes an edge.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut cut = line.len();
        for (i, c) in line.char_indices() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str && c == '/' && prev == '/' {
                cut = i - 1;
                break;
            }
            prev = if prev == '\\' && c == '\\' { '\0' } else { c };
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// The text without its `#[cfg(test)]` modules, and the names of test-only file modules.
fn strip_tests(text: &str) -> (String, BTreeSet<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut excluded) = (Vec::new(), BTreeSet::new());
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim().starts_with("#[") {
                j += 1;
            }
            if let Some(decl) = lines.get(j).and_then(|l| mod_decl(l)) {
                match decl {
                    (name, true) => {
                        excluded.insert(name);
                        i = j + 1;
                    }
                    (_, false) => {
                        // Skip the block to its closing brace.
                        let mut depth = 0i64;
                        let mut k = j;
                        while k < lines.len() {
                            depth += lines[k].matches('{').count() as i64;
                            depth -= lines[k].matches('}').count() as i64;
                            if depth <= 0 && k > j {
                                break;
                            }
                            k += 1;
                        }
                        i = k + 1;
                    }
                }
                continue;
            }
        }
        out.push(lines[i]);
        i += 1;
    }
    (out.join("\n"), excluded)
}

/// `mod name;` → (name, true); `mod name {` → (name, false).
fn mod_decl(line: &str) -> Option<(String, bool)> {
    let t = line.trim();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let rest = t.strip_prefix("mod ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let after = rest[name.len()..].trim_start();
    if after.starts_with(';') {
        Some((name, true))
    } else if after.starts_with('{') {
        Some((name, false))
    } else {
        None
    }
}

/// A `use` tree expanded to its paths: `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    if let Some(open) = tree.find("::{") {
        if tree.ends_with('}') {
            let prefix = &tree[..open];
            let body = &tree[open + 3..tree.len() - 1];
            let mut parts = Vec::new();
            let (mut depth, mut cur) = (0, String::new());
            for c in body.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if c == ',' && depth == 0 {
                    parts.push(std::mem::take(&mut cur));
                } else {
                    cur.push(c);
                }
            }
            parts.push(cur);
            return parts
                .iter()
                .map(|p| p.trim())
                .filter(|p| !p.is_empty())
                .flat_map(expand)
                .map(|e| {
                    if e == "self" {
                        prefix.to_string()
                    } else {
                        format!("{prefix}::{e}")
                    }
                })
                .collect();
        }
    }
    let path = tree.split(" as ").next().unwrap_or(tree);
    vec![path.trim().to_string()]
}

/// Every `ident::ident::...` path in the code, with the character before it.
fn paths(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if word(b[i]) && (i == 0 || !(word(b[i - 1]) || b[i - 1] == b':')) {
            let start = i;
            let mut end = i;
            loop {
                while end < b.len() && word(b[end]) {
                    end += 1;
                }
                if end + 2 < b.len() && &b[end..end + 2] == b"::" && word(b[end + 2]) {
                    end += 2;
                } else {
                    break;
                }
            }
            if code[start..end].contains("::") {
                out.push(code[start..end].to_string());
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn resolve(m: &Module, path: &str, modules: &BTreeSet<Module>) -> Option<Module> {
    let mut segs = path.split("::").map(str::to_string).peekable();
    let first = segs.peek().cloned()?;
    let mut base: Module = match first.as_str() {
        "crate" => {
            segs.next();
            Vec::new()
        }
        "super" | "self" => m.clone(),
        _ => {
            let mut child = m.clone();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            m.clone()
        }
    };
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => break,
        }
        segs.next();
    }
    let mut best = base.clone();
    for s in segs {
        base.push(s);
        if modules.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut code = BTreeMap::new();
    let mut excluded = BTreeSet::new();
    for f in &files {
        let m = module_of(src, f);
        if m.first().is_some_and(|s| s == "bin") {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read source");
        let (kept, ex) = strip_tests(&strip_comments(&text));
        for name in ex {
            let mut t = m.clone();
            t.push(name);
            excluded.insert(t);
        }
        code.insert(m, kept);
    }
    code.retain(|m, _| !excluded.iter().any(|x| m.starts_with(x)));
    let modules: BTreeSet<Module> = code.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (m, text) in &code {
        let mut all = Vec::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("use ") {
            let before_ok = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
            let tail = &rest[at + 4..];
            let Some(end) = tail.find(';') else { break };
            if before_ok {
                all.extend(expand(&tail[..end]));
            }
            rest = &tail[end.min(tail.len())..];
        }
        all.extend(paths(text));
        let edges: BTreeSet<Module> = all
            .iter()
            .filter_map(|p| resolve(m, p, &modules))
            .filter(|n| n != m && modules.contains(n))
            .collect();
        g.insert(m.clone(), edges);
    }
    g
}

/// Strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct T<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Module) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

#[test]
fn no_module_cycles_in_load_workload_and_cli() {
    let mut report = String::new();
    for krate in ["vramroom-load", "vramroom-workload", "vramroom"] {
        let g = graph(&crates_dir().join(krate).join("src"));
        assert!(g.len() > 5, "{krate}: read only {} modules", g.len());
        for comp in cycles(&g) {
            let names: Vec<String> = comp.iter().map(name).collect();
            report.push_str(&format!("{krate}: cycle among {}\n", names.join(", ")));
            for a in &comp {
                for b in g[a].iter().filter(|b| comp.contains(b)) {
                    report.push_str(&format!("    {} -> {}\n", name(a), name(b)));
                }
            }
        }
    }
    assert!(report.is_empty(), "module cycles:\n{report}");
}

/// The checker itself sees a cycle, through `super::` and through `crate::` paths, and
/// ignores comments and test modules.
#[test]
fn the_checker_finds_planted_cycles() {
    let dir = std::env::temp_dir().join(format!("vramroom-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("report")).expect("mkdir");
    let w = |p: &str, t: &str| std::fs::write(src.join(p), t).expect("write");
    w("lib.rs", "pub mod a;\npub mod b;\npub mod report;\n");
    w(
        "a.rs",
        "use crate::b::Thing;\n// crate::report::x in a comment is no edge\n",
    );
    w("b.rs", "pub struct Thing;\nfn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests {\n    use crate::report::x;\n}\n");
    w(
        "report/mod.rs",
        "pub mod page;\npub fn fmt() {}\npub fn r() { page::render() }\n",
    );
    w("report/page.rs", "use super::{fmt, other};\n");
    let g = graph(&src);
    let found: Vec<Vec<String>> = cycles(&g)
        .iter()
        .map(|c| {
            let mut v: Vec<String> = c.iter().map(name).collect();
            v.sort();
            v
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        found.contains(&vec!["a".to_string(), "b".to_string()]),
        "{found:?}"
    );
    assert!(
        found.contains(&vec!["report".to_string(), "report::page".to_string()]),
        "{found:?}"
    );
    assert!(
        !g[&vec!["b".to_string()]].contains(&vec!["report".to_string()]),
        "test module counted"
    );
    assert!(
        !g[&vec!["a".to_string()]].contains(&vec!["report".to_string()]),
        "comment counted"
    );
}
