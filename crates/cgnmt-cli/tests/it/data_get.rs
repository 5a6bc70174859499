//! `cgnmt data list | get | verify` against a loopback HTTP server started here (127.0.0.1 only; the machine
//! has no internet): fixture archives in the registry's formats become the right line-aligned pairs, a dropped
//! connection is resumed with a range request, and a bad checksum, a 404 and a download that never completes
//! are errors that name the URL and leave nothing behind.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use sha2::Digest;

/// How the server answers a file's requests.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Whole,
    /// The first response sends half of the body and closes the connection.
    DropFirst,
    /// Every response sends half of what it announces.
    DropAlways,
}

struct Server {
    port: u16,
    /// "GET /path" and "GET /path Range: bytes=N-" per request.
    log: Arc<Mutex<Vec<String>>>,
}

fn serve(files: HashMap<String, (Vec<u8>, Mode)>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(vec![]));
    let l2 = log.clone();
    std::thread::spawn(move || {
        let mut served: HashMap<String, usize> = HashMap::new();
        for stream in listener.incoming() {
            let Ok(s) = stream else { continue };
            let _ = answer(s, &files, &mut served, &l2);
        }
    });
    Server { port, log }
}

fn answer(
    mut s: TcpStream,
    files: &HashMap<String, (Vec<u8>, Mode)>,
    served: &mut HashMap<String, usize>,
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut r = BufReader::new(s.try_clone()?);
    let mut first = String::new();
    r.read_line(&mut first)?;
    let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range: Option<usize> = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
            range = v.trim().trim_end_matches('-').parse().ok();
        }
    }
    log.lock().unwrap().push(match range {
        Some(n) => format!("GET {path} Range: bytes={n}-"),
        None => format!("GET {path}"),
    });
    let Some((body, mode)) = files.get(&path) else {
        let msg = b"not here";
        write!(
            s,
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            msg.len()
        )?;
        return s.write_all(msg);
    };
    let count = served.entry(path.clone()).or_insert(0);
    *count += 1;
    let start = range.unwrap_or(0).min(body.len());
    let rest = &body[start..];
    if start > 0 {
        write!(
            s,
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\nConnection: close\r\n\r\n",
            rest.len(),
            body.len() - 1,
            body.len()
        )?;
    } else {
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
            rest.len()
        )?;
    }
    let drop_now = match mode {
        Mode::Whole => false,
        Mode::DropFirst => *count == 1,
        Mode::DropAlways => true,
    };
    if drop_now {
        s.write_all(&rest[..rest.len() / 2])?;
        s.flush()?;
        return s.shutdown(std::net::Shutdown::Both);
    }
    s.write_all(rest)
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn tar_gz(members: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, text) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(text.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, text.as_bytes()).unwrap();
    }
    gz(&b.into_inner().unwrap())
}

fn sha(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn cgnmt(args: &[&str], dir: &Path, registry: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .arg("data")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .arg("--registry")
        .arg(registry)
        .output()
        .unwrap()
}

fn entry(name: &str, files: &[(String, Option<String>)], format: &str) -> String {
    let files: Vec<String> = files
        .iter()
        .map(|(u, h)| match h {
            Some(h) => format!("{{ url = \"{u}\", sha256 = \"{h}\" }}"),
            None => format!("{{ url = \"{u}\" }}"),
        })
        .collect();
    format!(
        "[[corpus]]\nname = \"{name}\"\ndescription = \"fixture\"\nlicence = \"test\"\nsplit = \"test\"\n\
         src_lang = \"zh\"\ntgt_lang = \"en\"\nfiles = [{}]\nformat = {format}\n\n",
        files.join(", ")
    )
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// What a failed `get` of `name` must not leave: its directory, its work directory, partial downloads.
fn nothing_left(dir: &Path, name: &str) {
    assert!(!dir.join(name).exists(), "{name}: a directory was left");
    let left: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().contains(name)),
        "{name}: left {left:?}"
    );
}

#[test]
fn data_get_extracts_resumes_verifies_and_refuses_bad_downloads() {
    let tmp = tempfile::tempdir().unwrap();
    // news-commentary style TSV (English first), with a row whose Chinese side is empty.
    let tsv = gz("Hello.\t你好。\nThanks.\t\nGood night.\t晚安。\n".as_bytes());
    // WMT style SGML in a tar.gz.
    let sgm_src = "<srcset setid=\"t\" srclang=\"zh\">\n<doc docid=\"d\">\n<p>\n<seg id=\"1\">我们 &amp; 你们</seg>\n<seg id=\"2\">再见</seg>\n</p>\n</doc>\n</srcset>\n";
    let sgm_ref = "<refset setid=\"t\" trglang=\"en\">\n<doc docid=\"d\">\n<seg id=\"1\">we &amp; you</seg>\n<seg id=\"2\">bye</seg>\n</doc>\n</refset>\n";
    let tgz = tar_gz(&[
        ("sgm/test-zhen-src.zh.sgm", sgm_src),
        ("sgm/test-zhen-ref.en.sgm", sgm_ref),
    ]);
    // FLORES style plain members in a tar.gz.
    let flores = tar_gz(&[
        ("f/dev/zho_Hans.dev", "一\n二\n三\n"),
        ("f/dev/eng_Latn.dev", "one\ntwo\nthree\n"),
    ]);
    // A large file for resuming (so that half of it is many packets).
    let big_src: String = (0..20000).map(|k| format!("句子 {k}\n")).collect();
    let big_tgt: String = (0..20000).map(|k| format!("sentence {k}\n")).collect();
    let (big_src, big_tgt) = (gz(big_src.as_bytes()), big_tgt.into_bytes());
    // Hansards style: a plain tar of gzip-compressed ISO-8859-1 document pairs.
    let hansards = {
        let mut b = tar::Builder::new(Vec::new());
        for (name, text) in [
            ("h/debates/b.e.gz", &b"Thank you.\nYes.\n"[..]),
            ("h/debates/b.f.gz", &b"Merci.\nOui.\n"[..]),
            ("h/debates/a.e.gz", &b"The House.\n"[..]),
            ("h/debates/a.f.gz", &b"La Chambre \xe9lue.\n"[..]),
        ] {
            let z = gz(text);
            let mut h = tar::Header::new_gnu();
            h.set_size(z.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, &z[..]).unwrap();
        }
        b.into_inner().unwrap()
    };
    // Tatoeba Challenge style: four columns, a filter on the second.
    let tatoeba =
        "eng\tcmn_Hans\tI see.\t我明白。\neng\tyue_Hant\tNo.\t唔係。\neng\tcmn_Hant\tYes.\t是。\n"
            .as_bytes()
            .to_vec();
    let mut files = HashMap::new();
    files.insert("/hansards.tar".to_string(), (hansards.clone(), Mode::Whole));
    files.insert("/tatoeba.txt".to_string(), (tatoeba.clone(), Mode::Whole));
    files.insert("/nc.tsv.gz".to_string(), (tsv.clone(), Mode::Whole));
    files.insert("/test.tgz".to_string(), (tgz.clone(), Mode::Whole));
    files.insert("/flores.tar.gz".to_string(), (flores.clone(), Mode::Whole));
    files.insert("/big.zh.gz".to_string(), (big_src.clone(), Mode::DropFirst));
    files.insert("/big.en".to_string(), (big_tgt.clone(), Mode::DropFirst));
    files.insert("/bad.tsv.gz".to_string(), (tsv.clone(), Mode::Whole));
    files.insert("/cut.tsv.gz".to_string(), (tsv.clone(), Mode::DropAlways));
    let server = serve(files);
    let url = |p: &str| format!("http://127.0.0.1:{}{p}", server.port);
    let mut reg = String::new();
    reg += &entry(
        "nc",
        &[(url("/nc.tsv.gz"), Some(sha(&tsv)))],
        "{ type = \"tsv\", src_column = 1, tgt_column = 0 }",
    );
    reg += &entry(
        "wmt",
        &[(url("/test.tgz"), Some(sha(&tgz)))],
        "{ type = \"tar\", src = \"sgm/test-zhen-src.zh.sgm\", tgt = \"sgm/test-zhen-ref.en.sgm\", text = \"sgm\" }",
    );
    reg += &entry(
        "flores",
        &[(url("/flores.tar.gz"), None)],
        "{ type = \"tar\", src = \"f/dev/zho_Hans.dev\", tgt = \"f/dev/eng_Latn.dev\" }",
    );
    reg += &entry(
        "big",
        &[
            (url("/big.zh.gz"), Some(sha(&big_src))),
            (url("/big.en"), Some(sha(&big_tgt))),
        ],
        "{ type = \"pair\" }",
    );
    reg += &entry(
        "bad",
        &[(url("/bad.tsv.gz"), Some("0".repeat(64)))],
        "{ type = \"tsv\", src_column = 1, tgt_column = 0 }",
    );
    reg += &entry(
        "missing",
        &[(url("/nowhere.tgz"), None)],
        "{ type = \"tsv\", src_column = 1, tgt_column = 0 }",
    );
    reg += &entry(
        "cut",
        &[(url("/cut.tsv.gz"), None)],
        "{ type = \"tsv\", src_column = 1, tgt_column = 0 }",
    );
    reg += &entry(
        "hansards",
        &[(url("/hansards.tar"), Some(sha(&hansards)))],
        "{ type = \"tar-documents\", src_suffix = \".f.gz\", tgt_suffix = \".e.gz\", latin1 = true }",
    );
    reg += &entry(
        "tatoeba",
        &[(url("/tatoeba.txt"), None)],
        "{ type = \"tsv\", src_column = 3, tgt_column = 2, keep_column = 1, keep = \"cmn\" }",
    );
    let registry = tmp.path().join("registry.toml");
    std::fs::write(&registry, reg).unwrap();
    let dir = tmp.path().join("data");

    // The formats, extracted.
    let o = cgnmt(&["get", "nc", "wmt", "flores", "--quiet"], &dir, &registry);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(lines(&dir.join("nc/test.zh")), ["你好。", "晚安。"]);
    assert_eq!(lines(&dir.join("nc/test.en")), ["Hello.", "Good night."]);
    assert!(err.contains("1 lines with an empty side left out"), "{err}");
    assert_eq!(lines(&dir.join("wmt/test.zh")), ["我们 & 你们", "再见"]);
    assert_eq!(lines(&dir.join("wmt/test.en")), ["we & you", "bye"]);
    assert_eq!(lines(&dir.join("flores/test.zh")), ["一", "二", "三"]);
    assert_eq!(lines(&dir.join("flores/test.en")), ["one", "two", "three"]);
    let record = std::fs::read_to_string(dir.join("flores/SOURCE.toml")).unwrap();
    assert!(
        record.contains(&sha(&flores)),
        "the seen checksum is recorded: {record}"
    );
    let o = cgnmt(&["get", "hansards", "tatoeba", "--quiet"], &dir, &registry);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // Documents in the order of their names, ISO-8859-1 made UTF-8 (the "zh" side holds the French here).
    assert_eq!(
        lines(&dir.join("hansards/test.zh")),
        ["La Chambre élue.", "Merci.", "Oui."]
    );
    assert_eq!(
        lines(&dir.join("hansards/test.en")),
        ["The House.", "Thank you.", "Yes."]
    );
    assert_eq!(lines(&dir.join("tatoeba/test.zh")), ["我明白。", "是。"]);
    assert_eq!(lines(&dir.join("tatoeba/test.en")), ["I see.", "Yes."]);
    assert!(
        err.contains("1 rows not kept by the entry's filter"),
        "{err}"
    );
    // What is there is not fetched again without --force.
    let o = cgnmt(&["get", "nc", "--quiet"], &dir, &registry);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("already there"));

    // A dropped connection is resumed where it stopped.
    let o = cgnmt(&["get", "big", "--quiet"], &dir, &registry);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(lines(&dir.join("big/test.en")).len(), 20000);
    assert_eq!(lines(&dir.join("big/test.zh"))[19999], "句子 19999");
    let log = server.log.lock().unwrap().clone();
    for (p, len) in [("/big.zh.gz", big_src.len()), ("/big.en", big_tgt.len())] {
        let resumed: Vec<&String> = log
            .iter()
            .filter(|l| l.starts_with(&format!("GET {p} Range")))
            .collect();
        assert_eq!(resumed.len(), 1, "{log:?}");
        let at: usize = resumed[0]
            .rsplit('=')
            .next()
            .unwrap()
            .trim_end_matches('-')
            .parse()
            .unwrap();
        assert!(at > 0 && at <= len / 2, "resumed at {at} of {len}");
    }

    // list and verify.
    let o = cgnmt(&["list"], &dir, &registry);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("nc ") && l.contains("fetched ")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("bad ") && l.contains("not fetched")),
        "{out}"
    );
    let o = cgnmt(&["verify"], &dir, &registry);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(String::from_utf8_lossy(&o.stdout).matches("ok ").count(), 6);
    std::fs::write(dir.join("wmt/test.en"), "we & you\n").unwrap();
    let o = cgnmt(&["verify", "wmt"], &dir, &registry);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !o.status.success() && out.contains("wmt/test.en") && out.contains("changed"),
        "{out}"
    );

    // Refused downloads leave nothing behind.
    for (name, want) in [
        ("bad", "checksum mismatch".to_string()),
        ("missing", format!("{}: HTTP 404", url("/nowhere.tgz"))),
        ("cut", "gave up after 5 attempts".to_string()),
    ] {
        let o = cgnmt(&["get", name, "--quiet"], &dir, &registry);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} succeeded");
        assert!(err.contains(&want), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        nothing_left(&dir, name);
    }
    let o = cgnmt(&["get", "nosuch"], &dir, &registry);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no corpus \"nosuch\"") && err.contains("flores"),
        "{err}"
    );
}
