//! The layering check (`../shared/design/house.md` §7): reads the sources of `router`, `shard`
//! and `pipeline`, collects each file's imports of its own crate (`crate::…` and resolved
//! `super::…` paths, outside its test module), and holds the layers:
//!
//! * the rules of house.md §2 and §3, each for the directories that exist;
//! * ratchets: how many files sit in import cycles, and how many import a composition root
//!   (`router.rs`, `commands/`) that only the launcher should, may go down and never up. A
//!   change that lowers a count lowers its ceiling here in the same commit.
//!
//! Pure reading: no build of the crates is involved, so a failure names files and imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside a crate (`["commands", "crud"]`; the crate root is empty).
type Module = Vec<String>;

/// Files in import cycles, per crate, at most: none in any crate.
const CYCLE_CEILING: &[(&str, usize)] = &[("router", 0), ("shard", 0), ("pipeline", 0)];

/// Files that import a composition root other than those allowed to, per rule, at most.
const ROOT_IMPORT_CEILING: &[(&str, usize)] = &[
    (
        "router: router.rs imported only by server.rs and launch.rs",
        0,
    ),
    (
        "router: commands/ imported only by server.rs, launch.rs and http/ (the front ends)",
        0,
    ),
    ("shard: commands/ imported only by lib.rs and server.rs", 0),
];

struct Crate {
    name: &'static str,
    /// Each file's module and the modules it imports.
    imports: BTreeMap<Module, BTreeSet<Module>>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The module a source file holds, or `None` for what is not part of the library's tree
/// (the binary root, `bin/`, test modules in files of their own).
fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main") {
        return None;
    }
    match stem {
        "lib" if parts.is_empty() => {}
        "mod" => {}
        _ => parts.push(stem.to_string()),
    }
    if parts.iter().any(|p| p == "tests") {
        return None;
    }
    Some(parts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its trailing test module.
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines[i + 1..]
                .iter()
                .map(|l| l.trim_start())
                .find(|l| !l.is_empty() && !l.starts_with("#["))
                .is_some_and(|l| l.starts_with("mod ") && l.ends_with('{'))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let line = match line.find(" //") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
        i += 1;
    }
    i
}

fn skip_space(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The paths of a `use` tree or expression path starting at `i` (just after `prefix::`),
/// each the prefix's segments followed by its own.
fn paths_at(s: &[u8], i: usize, prefix: &[String], out: &mut Vec<Module>) -> usize {
    let mut segments = prefix.to_vec();
    let mut i = skip_space(s, i);
    loop {
        if i < s.len() && s[i] == b'{' {
            // A group: each item is a tree of its own under the segments so far.
            i += 1;
            loop {
                i = skip_space(s, i);
                if i >= s.len() || s[i] == b'}' {
                    return i + 1;
                }
                i = paths_at(s, i, &segments, out);
                i = skip_space(s, i);
                if i < s.len() && s[i] == b',' {
                    i += 1;
                }
            }
        }
        let end = ident_end(s, i);
        if end == i {
            out.push(segments);
            return i;
        }
        let ident = String::from_utf8_lossy(&s[i..end]).into_owned();
        // `{self, ..}` names the group's own path.
        if ident != "self" {
            segments.push(ident);
        }
        i = end;
        if s[i..].starts_with(b"::") {
            i += 2;
        } else {
            out.push(segments);
            return i;
        }
    }
}

/// The absolute paths a module's code names through `crate::` and `super::`.
fn named_paths(module: &Module, code: &str) -> Vec<Module> {
    let s = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_');
        if boundary && s[i..].starts_with(b"crate::") {
            i = paths_at(s, i + "crate::".len(), &[], &mut out);
            continue;
        }
        if boundary && s[i..].starts_with(b"super::") {
            // The parent of the file's module (`a/b.rs` and `a/b/mod.rs` alike: `a`).
            let mut base = module.clone();
            base.pop();
            let mut j = i + "super::".len();
            while s[j..].starts_with(b"super::") {
                base.pop();
                j += "super::".len();
            }
            i = paths_at(s, j, &base, &mut out);
            continue;
        }
        i += 1;
    }
    out
}

fn load(name: &'static str) -> Crate {
    let src = workspace().join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut named: BTreeMap<Module, Vec<Module>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file");
        named.insert(module.clone(), named_paths(&module, &code(&text)));
    }
    let known: BTreeSet<Module> = named.keys().cloned().collect();
    let imports = named
        .into_iter()
        .map(|(module, paths)| {
            let targets = paths
                .iter()
                .map(|path| {
                    // The longest prefix of the path that is a module with a file.
                    (0..=path.len())
                        .rev()
                        .map(|n| path[..n].to_vec())
                        .find(|p| known.contains(p))
                        .unwrap_or_default()
                })
                .filter(|t| *t != module)
                .collect();
            (module, targets)
        })
        .collect();
    Crate { name, imports }
}

fn show(m: &Module) -> String {
    if m.is_empty() {
        "lib.rs".into()
    } else {
        m.join("/")
    }
}

/// The files of the crate that sit in an import cycle (strongly connected components of more
/// than one file), each cycle listed.
fn cycles(c: &Crate) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on_stack: BTreeSet<Module>,
        components: Vec<Vec<Module>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &Module) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            let graph = self.graph;
            for w in graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = w == *v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph: &c.imports,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in c.imports.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.components
}

fn starts_with(m: &Module, prefix: &[&str]) -> bool {
    m.len() >= prefix.len() && m.iter().zip(prefix).all(|(a, b)| a == b)
}

/// Module paths (each a prefix: a module and what is under it).
type Prefixes = &'static [&'static [&'static str]];

/// A layer rule: what files under `from` may import within their crate (the rule holds once
/// `from` exists).
struct Rule {
    krate: &'static str,
    from: &'static [&'static str],
    may: May,
}

enum May {
    /// Only these.
    Only(Prefixes),
    /// Anything but these.
    Not(Prefixes),
}

const RULES: &[Rule] = &[
    // house.md §2: the kernel imports only the kernel; streams only the kernel.
    Rule {
        krate: "router",
        from: &["kernel"],
        may: May::Only(&[&["kernel"]]),
    },
    Rule {
        krate: "router",
        from: &["streams"],
        may: May::Only(&[&["kernel"], &["streams"]]),
    },
    // subscriptions.md §3: subscriptions run on the kernel and the streams, never the router.
    Rule {
        krate: "router",
        from: &["subscriptions"],
        may: May::Only(&[&["kernel"], &["streams"], &["subscriptions"]]),
    },
    // What commands run on is a value below them: it neither starts nor serves the router.
    Rule {
        krate: "router",
        from: &["seams"],
        may: May::Not(&[&["router"], &["commands"], &["server"], &["launch"]]),
    },
    // The command registries are leaves: dispatch, auth, the field checks and the transaction
    // rule match on them.
    Rule {
        krate: "router",
        from: &["command"],
        may: May::Only(&[]),
    },
    Rule {
        krate: "shard",
        from: &["command"],
        may: May::Only(&[]),
    },
    // house.md §3: the pure sharding types, the key holds (which name storage's tables), a
    // command's session fields and the write set are leaves; the log, apply and its observers
    // import neither the executor nor commands.
    Rule {
        krate: "shard",
        from: &["sharding"],
        may: May::Only(&[&["sharding"]]),
    },
    Rule {
        krate: "shard",
        from: &["holds"],
        may: May::Only(&[&["sharding"], &["storage"]]),
    },
    Rule {
        krate: "shard",
        from: &["session"],
        may: May::Only(&[]),
    },
    Rule {
        krate: "shard",
        from: &["write", "write_set"],
        may: May::Only(&[&["sharding"]]),
    },
    Rule {
        krate: "shard",
        from: &["log"],
        may: May::Not(&[&["write", "executor"], &["commands"]]),
    },
    Rule {
        krate: "shard",
        from: &["apply"],
        may: May::Not(&[&["write", "executor"], &["commands"]]),
    },
    // Replication (replication.md §3) sits beside the log: it applies write sets to a
    // member's storage and never reaches up into execution or the commands.
    Rule {
        krate: "shard",
        from: &["repl"],
        may: May::Only(&[&["repl"], &["log"], &["storage"], &["write", "write_set"]]),
    },
    Rule {
        krate: "shard",
        from: &["observers"],
        may: May::Not(&[&["write", "executor"], &["commands"]]),
    },
];

fn rule_violations(crates: &[Crate]) -> Vec<String> {
    let mut out = Vec::new();
    for c in crates {
        for rule in RULES.iter().filter(|r| r.krate == c.name) {
            for (from, targets) in c.imports.iter().filter(|(m, _)| starts_with(m, rule.from)) {
                for t in targets {
                    let allowed = match rule.may {
                        May::Only(only) => only.iter().any(|a| starts_with(t, a)),
                        May::Not(not) => !not.iter().any(|a| starts_with(t, a)),
                    };
                    if !allowed {
                        out.push(format!("{}: {} imports {}", c.name, show(from), show(t)));
                    }
                }
            }
        }
    }
    out
}

/// The files that import `target` (a module and what is under it) apart from `allowed`.
fn importers(c: &Crate, target: &[&str], allowed: &[&[&str]]) -> Vec<String> {
    c.imports
        .iter()
        .filter(|(m, _)| !starts_with(m, target) && !m.is_empty())
        .filter(|(m, _)| !allowed.iter().any(|a| m.as_slice() == *a))
        .filter(|(_, ts)| ts.iter().any(|t| starts_with(t, target)))
        .map(|(m, _)| show(m))
        .collect()
}

#[test]
fn modules_import_only_across_the_declared_layers() {
    let crates: Vec<Crate> = ["router", "shard", "pipeline"]
        .into_iter()
        .map(load)
        .collect();
    assert!(
        crates.iter().all(|c| c.imports.len() > 10),
        "the sources were found"
    );
    let broken = rule_violations(&crates);
    assert!(
        broken.is_empty(),
        "imports across the layers:\n{}",
        broken.join("\n")
    );

    let mut over = Vec::new();
    for c in &crates {
        let found = cycles(c);
        let files: usize = found.iter().map(Vec::len).sum();
        let ceiling = CYCLE_CEILING
            .iter()
            .find(|(k, _)| *k == c.name)
            .map_or(0, |(_, n)| *n);
        println!(
            "{}: {files} files in {} import cycles (ceiling {ceiling})",
            c.name,
            found.len()
        );
        if files > ceiling {
            let listed: Vec<String> = found
                .iter()
                .map(|cycle| cycle.iter().map(show).collect::<Vec<_>>().join(", "))
                .collect();
            over.push(format!(
                "{}: {files} files in import cycles, more than the ceiling {ceiling}:\n  {}",
                c.name,
                listed.join("\n  ")
            ));
        }
    }
    let router = &crates[0];
    let shard = &crates[1];
    let roots = [
        importers(router, &["router"], &[&["server"], &["launch"]]),
        importers(
            router,
            &["commands"],
            &[&["server"], &["launch"], &["http"]],
        ),
        importers(shard, &["commands"], &[&["server"]]),
    ];
    for ((rule, ceiling), files) in ROOT_IMPORT_CEILING.iter().zip(&roots) {
        println!("{rule}: {} files break it (ceiling {ceiling})", files.len());
        if files.len() > *ceiling {
            over.push(format!(
                "{rule}: {} files break it, more than the ceiling {ceiling}: {}",
                files.len(),
                files.join(", ")
            ));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

#[test]
fn imports_are_read_from_use_trees_and_paths() {
    let module: Module = vec!["commands".into(), "crud".into()];
    let code = code(
        "use crate::{router::Router, txn::{self, label}};\n\
         use super::args::Args; // crate::not::this\n\
         fn f() { crate::metrics::count(); let _ = \"x\"; }\n\
         pub(crate) fn g() {}\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::tested::Only;\n}\n",
    );
    let mut paths = named_paths(&module, &code);
    paths.sort();
    let expected: Vec<Module> = [
        vec!["commands", "args", "Args"],
        vec!["metrics", "count"],
        vec!["router", "Router"],
        vec!["txn"],
        vec!["txn", "label"],
    ]
    .into_iter()
    .map(|p| p.into_iter().map(String::from).collect())
    .collect();
    assert_eq!(paths, expected);
}
