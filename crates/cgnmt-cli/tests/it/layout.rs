//! The house rules, checked on the checkout: the library's layers import only downwards, no command uses
//! another and each is short, the commands are a small share of the code, no file or function is too long,
//! the library links no server, database or network crate, and every relative link in README.md and docs/
//! resolves.

use std::path::{Path, PathBuf};

use crate::common::repo;

/// Every `.rs` file under `dir` (recursively), sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The project's Rust files: the library, every crate's sources and tests, the build script.
fn all_rust_files() -> Vec<PathBuf> {
    let root = repo();
    let mut files = rust_files(&root.join("src"));
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        let c = e.unwrap().path();
        for sub in ["src", "tests", "benches", "examples"] {
            if c.join(sub).is_dir() {
                files.extend(rust_files(&c.join(sub)));
            }
        }
    }
    files.push(root.join("build.rs"));
    files
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

/// A line's code, without a `//` comment (doc comments name other modules in links).
fn code(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with("//") {
        ""
    } else {
        line
    }
}

/// The library's layers, lowest first: a module may import its own layer and those below it, never one above.
#[test]
fn the_librarys_layers_import_only_downwards() {
    let layers = ["kernels", "model", "decode", "train", "bench"];
    let src = repo().join("src");
    let mut wrong = vec![];
    for (k, layer) in layers.iter().enumerate() {
        for f in rust_files(&src.join(layer)) {
            for (n, l) in lines(&f).iter().enumerate() {
                for above in &layers[k + 1..] {
                    if code(l).contains(&format!("crate::{above}")) {
                        wrong.push(format!("{}:{}: {}", f.display(), n + 1, l.trim()));
                    }
                }
            }
        }
    }
    // The shared ground (configuration, errors, files, the process, the cluster) imports no layer.
    for f in ["config.rs", "error.rs", "atomic_file.rs", "process.rs"]
        .iter()
        .map(|f| src.join(f))
        .chain(rust_files(&src.join("cluster")))
    {
        for (n, l) in lines(&f).iter().enumerate() {
            for layer in &layers {
                if code(l).contains(&format!("crate::{layer}")) {
                    wrong.push(format!("{}:{}: {}", f.display(), n + 1, l.trim()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run upwards:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn commands_are_thin_separate_and_a_small_share_of_the_code() {
    let dir = repo().join("crates/cgnmt-cli/src/commands");
    let commands: Vec<PathBuf> = rust_files(&dir)
        .into_iter()
        .filter(|p| p.file_name().unwrap() != "mod.rs")
        .collect();
    assert_eq!(commands.len(), 22, "one file per subcommand: {commands:?}");
    let mut command_lines = 0;
    for f in &commands {
        let ls = lines(f);
        assert!(
            ls.len() <= 150,
            "{}: {} lines (at most 150)",
            f.display(),
            ls.len()
        );
        command_lines += ls.len();
        for (n, l) in ls.iter().enumerate() {
            let l = code(l);
            assert!(
                !l.contains("commands::") && !l.contains("super::"),
                "{}:{}: a command uses another: {l}",
                f.display(),
                n + 1
            );
        }
    }
    let total: usize = all_rust_files().iter().map(|f| lines(f).len()).sum();
    let share = command_lines as f64 / total as f64;
    eprintln!(
        "commands: {command_lines} of {total} Rust lines ({:.1}%)",
        100.0 * share
    );
    assert!(
        share <= 0.10,
        "the commands are {:.1}% of the Rust lines",
        100.0 * share
    );
}

/// The lines of each function with a body (rustfmt's layout: the closing brace at the `fn`'s indentation).
fn function_lengths(f: &Path) -> Vec<(String, usize, usize)> {
    let ls = lines(f);
    let mut out = vec![];
    for (i, l) in ls.iter().enumerate() {
        let t = code(l).trim_start();
        let head = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        let Some(rest) = head.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let indent = &l[..l.len() - t.len()];
        // The signature ends at the first line ending in `{` (a body), `;` (a declaration) or `}` (a body
        // on one line).
        let Some(open) = (i..ls.len()).find(|&j| {
            let s = ls[j].trim_end();
            s.ends_with('{') || s.ends_with(';') || s.ends_with('}')
        }) else {
            continue;
        };
        if !ls[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open..ls.len()).find(|&j| ls[j].trim_end() == close) {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

#[test]
fn no_file_over_1200_lines_and_no_function_over_200() {
    let mut long = vec![];
    for f in all_rust_files() {
        let n = lines(&f).len();
        if n > 1200 {
            long.push(format!("{}: {n} lines", f.display()));
        }
        // (Functions of the library and the applications; a few table-driven tests run longer.)
        if f.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        for (name, at, len) in function_lengths(&f) {
            if len > 200 {
                long.push(format!("{}:{at}: fn {name}: {len} lines", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "too long:\n{}", long.join("\n"));
    // The measure itself: this file's own functions are found, with their lengths.
    let here = function_lengths(&repo().join("crates/cgnmt-cli/tests/it/layout.rs"));
    let me = here
        .iter()
        .find(|(n, _, _)| n == "no_file_over_1200_lines_and_no_function_over_200")
        .expect("finds its own test");
    assert!(me.2 > 10 && me.2 < 40, "{me:?}");
}

/// `cargo tree -p cgnmt -e normal`: the library links no server (axum, tokio), database (rusqlite) or network
/// (ureq) crate; the applications do.
#[test]
fn the_library_links_no_server_database_or_network_crate() {
    // `cargo tree` of `package`'s normal dependencies, one crate per line (`depth` levels; all with `None`).
    let tree_at = |package: &str, depth: Option<&str>| -> String {
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ]);
        if let Some(d) = depth {
            cmd.args(["--depth", d]);
        }
        let out = cmd
            .arg("--manifest-path")
            .arg(repo().join("Cargo.toml"))
            .output()
            .expect("run cargo tree");
        assert!(
            out.status.success(),
            "cargo tree -p {package}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let tree = |package: &str| tree_at(package, None);
    let crates = |t: &str| -> Vec<String> {
        t.lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    };
    let lib = crates(&tree("cgnmt"));
    assert!(lib.iter().any(|c| c == "candle-core"), "{lib:?}");
    for banned in ["axum", "tokio", "rusqlite", "ureq", "hyper"] {
        assert!(
            !lib.iter().any(|c| c == banned),
            "the library links {banned}"
        );
    }
    // (The check can fail: the server's crate does link them.)
    let serve = crates(&tree("cgnmt-serve"));
    assert!(serve.iter().any(|c| c == "axum") && serve.iter().any(|c| c == "tokio"));
    // The library itself parses no command line: its direct dependencies hold no `clap` (the command line's
    // argument enums live in the CLI crate); the CLI's do.
    let direct = |package: &str| crates(&tree_at(package, Some("1")));
    assert!(
        !direct("cgnmt").iter().any(|c| c == "clap"),
        "the library depends on clap"
    );
    assert!(direct("cgnmt-cli").iter().any(|c| c == "clap"));
}

/// Every relative link of README.md and of the Markdown pages under docs/ and results/README.md resolves to a
/// file or folder of the checkout (an anchor is not checked, its file is).
#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = repo();
    let mut pages = vec![root.join("README.md"), root.join("results/README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    let mut broken = vec![];
    let mut checked = 0;
    for page in &pages {
        let text =
            std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                rest = &rest[end..];
                if target.contains("://")
                    || target.starts_with('#')
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let path = target.split('#').next().unwrap();
                checked += 1;
                if !page.parent().unwrap().join(path).exists() {
                    broken.push(format!("{}:{}: {target}", page.display(), n + 1));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} links found");
    assert!(
        broken.is_empty(),
        "links that resolve to nothing:\n{}",
        broken.join("\n")
    );
}
