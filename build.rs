//! Records the commit the binary is built from (`CGNMT_COMMIT`, e.g. for `reproduce`'s report), with
//! `-modified` when the working tree differs from it; "unknown" outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            let modified = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if modified {
                format!("{c}-modified")
            } else {
                c
            }
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=CGNMT_COMMIT={commit}");
    // A new commit moves HEAD's branch; staging or editing changes the index.
    for p in [".git/HEAD", ".git/index"] {
        println!("cargo:rerun-if-changed={p}");
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        println!("cargo:rerun-if-changed=.git/{r}");
    }
}
