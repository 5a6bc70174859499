//! `cgnmt analyze …` and `cgnmt plot …` end to end on small hand-made files: argument parsing,
//! file reading, text / JSON output, the PNG and SVG files written, and the error
//! paths (file:line for malformed JSON lines, mismatched line counts, bad arguments).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `cgnmt ARGS`: its standard output, or its standard error as the error (a failure to parse the arguments
/// included).
fn run(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .output()
        .expect("run cgnmt");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8 output"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

struct Files {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Files {
    fn new() -> Self {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        Files { _dir: d, root }
    }
    fn put(&self, name: &str, text: &str) -> String {
        let p = self.root.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
    fn path(&self, name: &str) -> String {
        self.root.join(name).display().to_string()
    }
}

/// Source lengths 2, 12, 12, 35 words: buckets <10, 10-20, 10-20, 30-40.
fn corpus(f: &Files) -> (String, String, String, String) {
    let w = |n: usize| vec!["w"; n].join(" ");
    let src = f.put(
        "src.txt",
        &format!("{}\n{}\n{}\n{}\n", w(2), w(12), w(12), w(35)),
    );
    let refs = "the cat sat on the mat\na b c d e f\ng h i j k l\nm n o p q r s\n";
    let r = f.put("ref.txt", refs);
    let base = f.put("base.txt", "the dog\na b c\nx y z\nm n o p\n");
    let sys = f.put("sys.txt", refs);
    (src, r, base, sys)
}

fn decode_png(p: &str) -> (u32, u32, Vec<u8>) {
    let dec = png::Decoder::new(std::fs::File::open(p).unwrap());
    let mut rd = dec.read_info().unwrap();
    let mut buf = vec![0; rd.output_buffer_size()];
    let info = rd.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Distinct colours and the fraction of non-white pixels: a blank or one-colour image fails.
fn assert_nontrivial(rgb: &[u8], min_colours: usize) {
    let px: Vec<&[u8]> = rgb.chunks(3).collect();
    let colours: HashSet<&[u8]> = px.iter().copied().collect();
    let ink = px.iter().filter(|p| **p != [255, 255, 255]).count() as f64 / px.len() as f64;
    assert!(colours.len() >= min_colours, "{} colours", colours.len());
    assert!(ink > 0.01 && ink < 0.95, "non-white fraction {ink}");
}

#[test]
fn lengths_text_json_and_plots() {
    let f = Files::new();
    let (src, r, base, sys) = corpus(&f);
    let a = format!("base={base}");
    let b = format!("gated={sys}");
    let out = run(&[
        "analyze", "lengths", "--src", &src, "-r", &r, "--sys", &a, "--sys", &b,
    ])
    .unwrap();
    assert!(
        out.contains("tok:mteval-v11b") && out.contains("case:lc"),
        "{out}"
    );
    assert!(out.contains("base") && out.contains("gated"), "{out}");
    for label in ["<10", "10-20", "20-30", "30-40", "40-50", "≥50"] {
        assert!(out.contains(label), "{label} missing in\n{out}");
    }
    let png_out = f.path("len.png");
    let js = run(&[
        "analyze", "lengths", "--src", &src, "-r", &r, "--sys", &a, "--sys", &b, "--json",
        "--plot", &png_out,
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&js).unwrap();
    let buckets = v["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 6);
    let counts: Vec<u64> = buckets
        .iter()
        .map(|b| b["sentences"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![1, 2, 0, 1, 0, 0]);
    // The system equal to the reference scores 100 wherever it has sentences.
    for bk in buckets {
        let g = &bk["systems"][1];
        assert_eq!(g["name"], "gated");
        if bk["sentences"].as_u64().unwrap() > 0 {
            assert!((g["bleu"].as_f64().unwrap() - 100.0).abs() < 1e-9);
        } else {
            assert!(g["bleu"].is_null() && g["mean_len"].is_null());
        }
    }
    // base in 10-20: "a b c" + "x y z" (6 words, mean 3).
    assert_eq!(buckets[1]["systems"][0]["words"], 6);
    assert_eq!(buckets[1]["systems"][0]["mean_len"], 3.0);
    assert_eq!(v["edges"], serde_json::json!([10, 20, 30, 40, 50]));
    let (w, h, rgb) = decode_png(&png_out);
    assert_eq!((w, h), (1280, 480));
    assert_nontrivial(&rgb, 20);

    // Custom edges, sacreBLEU, SVG chart with its text.
    let svg_out = f.path("len.svg");
    let js = run(&[
        "analyze",
        "lengths",
        "--src",
        &src,
        "-r",
        &r,
        "--sys",
        &a,
        "--edges",
        "5,20",
        "--bleu",
        "sacrebleu",
        "--json",
        "--plot",
        &svg_out,
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&js).unwrap();
    assert_eq!(v["buckets"].as_array().unwrap().len(), 3);
    assert_eq!(v["buckets"][2]["label"], "≥20");
    assert!(v["signature"].as_str().unwrap().contains("tok:13a"));
    let svg = std::fs::read_to_string(&svg_out).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));
    for t in [
        "BLEU by source length",
        "≥20",
        "&lt;5",
        "mean output length (words)",
    ] {
        assert!(svg.contains(t), "{t} missing in SVG");
    }
}

#[test]
fn lengths_errors() {
    let f = Files::new();
    let (src, r, _base, _sys) = corpus(&f);
    let short = f.put("short.txt", "a\nb\n");
    let s = format!("x={short}");
    let e = run(&["analyze", "lengths", "--src", &src, "-r", &r, "--sys", &s]).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("short.txt") && m.contains("src.txt") && m.contains("line count"),
        "{m}"
    );
    // Bad NAME=FILE, bad edges, bad plot extension, missing file.
    assert!(run(&["analyze", "lengths", "--src", &src, "-r", &r, "--sys", "nofile"]).is_err());
    let ok = format!("x={r}");
    let e = run(&[
        "analyze", "lengths", "--src", &src, "-r", &r, "--sys", &ok, "--edges", "20,10",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("strictly increasing"), "{e}");
    let e = run(&[
        "analyze", "lengths", "--src", &src, "-r", &r, "--sys", &ok, "--plot", "x.pdf",
    ])
    .unwrap_err();
    assert!(e.to_string().contains(".png or .svg"), "{e}");
    let missing = f.path("missing.txt");
    let e = run(&[
        "analyze", "lengths", "--src", &missing, "-r", &r, "--sys", &ok,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("missing.txt"), "{e}");
}

fn dump_line(id: usize, gates: &[f64]) -> String {
    serde_json::json!({
        "id": id, "src": ["w", "w", "</s>"], "hyp": ["a", "b", "</s>"], "score": -1.0,
        "attention": [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.0, 0.1, 0.9]],
        "gates": gates, "coverage": [1.0, 1.0, 1.0]
    })
    .to_string()
}

#[test]
fn gates_correlation_and_errors() {
    let f = Files::new();
    let (src, r, base, sys) = corpus(&f);
    // Improvements (sentence BLEU): sentences are all perfect for sys; base is worse on all.
    let dump = f.put(
        "dump.jsonl",
        &[
            dump_line(0, &[0.9, 0.7]),
            dump_line(2, &[0.5, 0.5]),
            dump_line(1, &[0.2, 0.4]),
            dump_line(3, &[]),
        ]
        .join("\n"),
    );
    let out = run(&[
        "analyze",
        "gates",
        "--src",
        &src,
        "-r",
        &r,
        "--baseline",
        &base,
        "--system",
        &sys,
        "--dump",
        &dump,
        "--long",
        "10",
        "--json",
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let sents = v["sentences"].as_array().unwrap();
    assert_eq!(sents.len(), 4);
    assert!((sents[0]["gate"].as_f64().unwrap() - 0.8).abs() < 1e-12);
    assert!((sents[1]["gate"].as_f64().unwrap() - 0.3).abs() < 1e-12); // id 1 (3rd line)
    assert!(sents[3]["gate"].is_null());
    let imp: Vec<f64> = sents
        .iter()
        .map(|s| s["improvement"].as_f64().unwrap())
        .collect();
    let gates = [0.8, 0.3, 0.5];
    let want = {
        let (x, y) = (&gates[..], &imp[..3]);
        let mx = x.iter().sum::<f64>() / 3.0;
        let my = y.iter().sum::<f64>() / 3.0;
        let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
        let sxx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
        let syy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
        sxy / (sxx * syy).sqrt()
    };
    let all = &v["correlations"][0];
    assert_eq!(all["n"], 3);
    assert!((all["r"].as_f64().unwrap() - want).abs() < 1e-9);
    // Long (>= 10 words): ids 1, 2 have gates (id 3 has none) -> n = 2.
    let long = &v["correlations"][1];
    assert_eq!(
        (
            long["subset"].as_str().unwrap(),
            long["n"].as_u64().unwrap()
        ),
        ("src_len>=10", 2)
    );
    // Text output; an undefined correlation is explained, not NaN.
    let out = run(&[
        "analyze",
        "gates",
        "--src",
        &src,
        "-r",
        &r,
        "--baseline",
        &base,
        "--system",
        &sys,
        "--dump",
        &dump,
        "--long",
        "30",
    ])
    .unwrap();
    assert!(
        out.contains("pearson r") && out.contains("src_len>=30"),
        "{out}"
    );
    assert!(out.contains("at least 2"), "{out}");
    assert!(out.contains("1 sentences without gate values"), "{out}");
    assert!(!out.to_lowercase().contains("nan"), "{out}");

    // No gates anywhere.
    let nog = f.put(
        "nogate.jsonl",
        &(0..4)
            .map(|i| dump_line(i, &[]))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let e = run(&[
        "analyze",
        "gates",
        "--src",
        &src,
        "-r",
        &r,
        "--baseline",
        &base,
        "--system",
        &sys,
        "--dump",
        &nog,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("no record has gate values"), "{e}");
    // Malformed JSON: file and line.
    let bad = f.put(
        "bad.jsonl",
        &format!("{}\n{{\"id\": 1, \"gates\": [0.1,\n", dump_line(0, &[0.5])),
    );
    let e = run(&[
        "analyze",
        "gates",
        "--src",
        &src,
        "-r",
        &r,
        "--baseline",
        &base,
        "--system",
        &sys,
        "--dump",
        &bad,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("bad.jsonl:2:"), "{e}");
    // Too few records.
    let few = f.put("few.jsonl", &dump_line(0, &[0.5]));
    let e = run(&[
        "analyze",
        "gates",
        "--src",
        &src,
        "-r",
        &r,
        "--baseline",
        &base,
        "--system",
        &sys,
        "--dump",
        &few,
    ])
    .unwrap_err();
    assert!(
        e.to_string().contains("few.jsonl") && e.to_string().contains("1 records"),
        "{e}"
    );
}

#[test]
fn context_scaling_json_and_plot() {
    let f = Files::new();
    let src = f.put("src.txt", "a b c d\ne f\n");
    let r = f.put("ref.txt", "w x y z\nu v\n");
    let same = f.put("o1.txt", "w x y z\nu v\n");
    let long = f.put("o2.txt", "w x y z w x\nu v u\n");
    let r1 = format!("1.0,1.0={same}");
    let r2 = format!("1.0,0.5={long}");
    let png_out = f.path("cs.png");
    let out = run(&[
        "analyze",
        "context-scaling",
        "--src",
        &src,
        "-r",
        &r,
        "--run",
        &r1,
        "--run",
        &r2,
        "--json",
        "--plot",
        &png_out,
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs[0]["ratio_src"], 1.0);
    assert!((runs[0]["bleu"].as_f64().unwrap() - 100.0).abs() < 1e-9);
    assert_eq!(runs[1]["out_words"], 9);
    assert!((runs[1]["ratio_src"].as_f64().unwrap() - 1.5).abs() < 1e-12);
    assert!((runs[1]["ratio_ref"].as_f64().unwrap() - 1.5).abs() < 1e-12);
    assert_eq!(
        (runs[1]["a"].as_f64(), runs[1]["b"].as_f64()),
        (Some(1.0), Some(0.5))
    );
    assert!(runs[1]["file"].as_str().unwrap().ends_with("o2.txt"));
    let (w, h, rgb) = decode_png(&png_out);
    assert_eq!((w, h), (1240, 460));
    assert_nontrivial(&rgb, 20);
    let svg_out = f.path("cs.svg");
    let txt = run(&[
        "analyze",
        "context-scaling",
        "--src",
        &src,
        "-r",
        &r,
        "--run",
        &r1,
        "--run",
        &r2,
        "--plot",
        &svg_out,
    ])
    .unwrap();
    assert!(txt.contains("(1.0, 0.5)") && txt.contains("1.500"), "{txt}");
    let svg = std::fs::read_to_string(&svg_out).unwrap();
    assert!(svg.contains("(1.0, 0.5)") && svg.contains("Translation length ratio"));
    // Bad --run syntax is a clap error.
    for bad in ["1.0=x", "a,b=x", "1,2=", "1,nan=x"] {
        assert!(
            run(&[
                "analyze",
                "context-scaling",
                "--src",
                &src,
                "-r",
                &r,
                "--run",
                bad
            ])
            .is_err(),
            "{bad}"
        );
    }
}

#[test]
fn attention_heatmap_png_svg_and_errors() {
    let f = Files::new();
    let rec = serde_json::json!({
        "id": 0, "src": ["我", "爱", "你", "</s>"], "hyp": ["I", "love", "you", "</s>"],
        "score": -1.2,
        "attention": [[0.9, 0.05, 0.03, 0.02], [0.1, 0.8, 0.05, 0.05], [0.0, 0.1, 0.85, 0.05], [0.0, 0.0, 0.1, 0.9]],
        "gates": [0.3, 0.6, 0.9], "coverage": [1.0, 0.95, 1.0, 0.95]
    });
    let nogate = serde_json::json!({
        "id": 1, "src": ["a", "</s>"], "hyp": ["b", "</s>"],
        "attention": [[0.7, 0.3], [0.2, 0.8]], "gates": [], "coverage": []
    });
    let dump = f.put("d.jsonl", &format!("{rec}\n{nogate}\n"));
    let png_out = f.path("att.png");
    let out = run(&[
        "plot",
        "attention",
        "--dump",
        &dump,
        "--id",
        "0",
        "-o",
        &png_out,
    ])
    .unwrap();
    assert!(out.contains("att.png"));
    let rec0: cgnmt_eval::analysis::DumpRecord = serde_json::from_value(rec.clone()).unwrap();
    let fig = cgnmt_eval::plot::AttentionFigure::from_record(&rec0).unwrap();
    let (w, h, rgb) = decode_png(&png_out);
    assert_eq!((w, h), cgnmt_eval::plot::Figure::size(&fig));
    assert_nontrivial(&rgb, 30);
    // The gate bars are drawn in steel blue (70, 130, 180).
    assert!(rgb.chunks(3).any(|p| p == [70, 130, 180]), "no gate bar");
    // The darkest cell (0.9) is drawn: grey level round(255 * 0.1) = 26.
    assert!(rgb.chunks(3).any(|p| p == [26, 26, 26]), "no 0.9 cell");

    let svg_out = f.path("att.svg");
    run(&[
        "plot",
        "attention",
        "--dump",
        &dump,
        "--id",
        "0",
        "-o",
        &svg_out,
    ])
    .unwrap();
    let svg = std::fs::read_to_string(&svg_out).unwrap();
    for t in ["love", "我", "&lt;/s&gt;", "gate", "Attention, sentence 0"] {
        assert!(svg.contains(t), "{t} missing in SVG");
    }
    assert!(
        svg.contains("Droid Sans Fallback"),
        "CJK labels use the CJK font"
    );
    // Without gates: no gate panel.
    let svg1 = f.path("att1.svg");
    run(&[
        "plot",
        "attention",
        "--dump",
        &dump,
        "--id",
        "1",
        "-o",
        &svg1,
    ])
    .unwrap();
    let svg = std::fs::read_to_string(&svg1).unwrap();
    assert!(
        !svg.contains(">\ngate\n<") && !svg.contains(">gate<"),
        "gate panel drawn without gates"
    );

    // Errors.
    let e = run(&[
        "plot",
        "attention",
        "--dump",
        &dump,
        "--id",
        "7",
        "-o",
        &png_out,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("no record with id 7"), "{e}");
    let e = run(&[
        "plot",
        "attention",
        "--dump",
        &dump,
        "--id",
        "0",
        "-o",
        "x.jpg",
    ])
    .unwrap_err();
    assert!(e.to_string().contains(".png or .svg"), "{e}");
    let bad = f.put("bad.jsonl", &format!("{rec}\nnot json\n"));
    let e = run(&[
        "plot",
        "attention",
        "--dump",
        &bad,
        "--id",
        "0",
        "-o",
        &png_out,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("bad.jsonl:2:"), "{e}");
    let shape = serde_json::json!({"id": 0, "src": ["a", "b"], "hyp": ["c"], "attention": [[1.0]]});
    let sh = f.put("shape.jsonl", &format!("{shape}\n"));
    let e = run(&[
        "plot",
        "attention",
        "--dump",
        &sh,
        "--id",
        "0",
        "-o",
        &png_out,
    ])
    .unwrap_err();
    assert!(format!("{e:#}").contains("2 source tokens"), "{e:#}");
    let empty = serde_json::json!({"id": 0, "src": [], "hyp": [], "attention": []});
    let em = f.put("empty.jsonl", &format!("{empty}\n"));
    let e = run(&[
        "plot",
        "attention",
        "--dump",
        &em,
        "--id",
        "0",
        "-o",
        &png_out,
    ])
    .unwrap_err();
    assert!(format!("{e:#}").contains("no attention matrix"), "{e:#}");
}

#[test]
fn training_curves_png_svg_and_errors() {
    let f = Files::new();
    let mut log = String::from("{\"config\": {\"lr\": 1}}\n");
    for s in 1..=30 {
        log.push_str(&format!(
            "{{\"step\":{},\"epoch\":0,\"seconds\":{},\"loss_per_token\":{},\"tgt_tok_per_s\":1000}}\n",
            s * 100,
            s,
            2.0 + 5.0 / s as f64
        ));
        if s % 10 == 0 {
            log.push_str(&format!(
                "{{\"eval\":{},\"epoch\":0,\"seconds\":{},\"loss_per_token\":{},\"dev_bleu\":{}}}\n",
                s * 100,
                s,
                2.5 + 4.0 / s as f64,
                s as f64 / 2.0
            ));
        }
    }
    let lp = f.put("train.log", &log);
    let png_out = f.path("t.png");
    run(&["plot", "training", "--log", &lp, "-o", &png_out]).unwrap();
    let (w, h, rgb) = decode_png(&png_out);
    assert_eq!((w, h), (1240, 480));
    assert_nontrivial(&rgb, 20);
    let svg_out = f.path("t.svg");
    run(&["plot", "training", "--log", &lp, "-o", &svg_out]).unwrap();
    let svg = std::fs::read_to_string(&svg_out).unwrap();
    for t in ["Loss per token", "Dev BLEU", "step", "train", "dev"] {
        assert!(svg.contains(t), "{t} missing in SVG");
    }
    // Only training lines: the BLEU panel says so instead of failing.
    let only = f.put(
        "only.log",
        "{\"step\":1,\"loss_per_token\":3.0}\n{\"step\":2,\"loss_per_token\":2.5}\n",
    );
    let svg2 = f.path("t2.svg");
    run(&["plot", "training", "--log", &only, "-o", &svg2]).unwrap();
    assert!(std::fs::read_to_string(&svg2)
        .unwrap()
        .contains("no data in the log"));
    // Errors.
    let bad = f.put(
        "bad.log",
        "{\"step\":1,\"loss_per_token\":3.0}\n\n{\"step\":2,\n",
    );
    let e = run(&["plot", "training", "--log", &bad, "-o", &png_out]).unwrap_err();
    assert!(e.to_string().contains("bad.log:3:"), "{e}");
    let none = f.put("none.log", "{\"config\":1}\n");
    let e = run(&["plot", "training", "--log", &none, "-o", &png_out]).unwrap_err();
    assert!(e.to_string().contains("no training"), "{e}");
    let e = run(&[
        "plot",
        "training",
        "--log",
        &f.path("nope.log"),
        "-o",
        &png_out,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("nope.log"), "{e}");
    assert!(Path::new(&png_out).exists());
}
