use cgnmt_data::tokenize::punct_tokenize;
use cgnmt_data::{
    default_for_lang, detokenize, read_lines, Tokenizer, TokenizerConfig, TokenizerKind,
};

use crate::common::{strs, tatoeba};

fn tok(kind: TokenizerKind, lowercase: bool) -> Tokenizer {
    Tokenizer::new(TokenizerConfig { kind, lowercase })
}

#[test]
fn jieba_segments_chinese_sentences() {
    let t = tok(TokenizerKind::Jieba, false);
    assert_eq!(t.tokenize("我们走吧。"), strs(&["我们", "走", "吧", "。"]));
    assert_eq!(
        t.tokenize("为什么是我？"),
        strs(&["为什么", "是", "我", "？"])
    );
    assert_eq!(
        t.tokenize("请抱紧汤姆。"),
        strs(&["请", "抱紧", "汤姆", "。"])
    );
    // Whitespace never yields tokens; Latin words survive.
    assert_eq!(t.tokenize("  我爱 Tom  "), strs(&["我", "爱", "Tom"]));
    assert!(t.tokenize("").is_empty());
    // The first 100 Tatoeba test lines: no empty or spaced tokens, text preserved.
    for l in read_lines(&tatoeba("test.zh")).unwrap().iter().take(100) {
        let toks = t.tokenize(l);
        assert!(toks
            .iter()
            .all(|w| !w.is_empty() && !w.contains(char::is_whitespace)));
        let no_space: String = l.split_whitespace().collect();
        assert_eq!(toks.concat(), no_space);
        let back = detokenize(&toks, TokenizerKind::Jieba);
        assert_eq!(back, no_space);
    }
}

#[test]
fn punct_tokenizer_on_english() {
    let t = tok(TokenizerKind::Punct, false);
    assert_eq!(
        t.tokenize("I don't know, Tom."),
        strs(&["I", "do", "n't", "know", ",", "Tom", "."])
    );
    assert_eq!(
        t.tokenize("Tom's car costs $1,000.50 (approx.)!"),
        strs(&["Tom", "'s", "car", "costs", "$", "1,000.50", "(", "approx.", ")", "!"])
    );
    assert_eq!(
        t.tokenize("Mr. Smith lives in the U.S. and we're \"happy\"..."),
        strs(&[
            "Mr.", "Smith", "lives", "in", "the", "U.S.", "and", "we", "'re", "\"", "happy", "\"",
            "..."
        ])
    );
    assert_eq!(
        t.tokenize("I can't, she'll go; it's a well-known fact."),
        strs(&[
            "I",
            "ca",
            "n't",
            ",",
            "she",
            "'ll",
            "go",
            ";",
            "it",
            "'s",
            "a",
            "well-known",
            "fact",
            "."
        ])
    );
    // French / German: elisions kept, Unicode punctuation split.
    assert_eq!(
        t.tokenize("« Aujourd'hui, l'homme – enfin ! »"),
        strs(&["«", "Aujourd'hui", ",", "l'homme", "–", "enfin", "!", "»"])
    );
    assert_eq!(
        t.tokenize("Das kostet 3,50 €, z.B. heute."),
        strs(&["Das", "kostet", "3,50", "€", ",", "z.B.", "heute", "."])
    );
    // Sentence-final abbreviation period is split.
    assert_eq!(
        t.tokenize("I live in the U.S."),
        strs(&["I", "live", "in", "the", "U.S", "."])
    );
}

#[test]
fn lowercase_and_whitespace_and_char() {
    assert_eq!(
        tok(TokenizerKind::Punct, true).tokenize("Hello, WORLD!"),
        strs(&["hello", ",", "world", "!"])
    );
    assert_eq!(
        tok(TokenizerKind::Whitespace, false).tokenize(" a  b\tc "),
        strs(&["a", "b", "c"])
    );
    assert_eq!(
        tok(TokenizerKind::Char, false).tokenize("私はTom2です。"),
        strs(&["私", "は", "Tom2", "で", "す", "。"])
    );
    assert_eq!(
        detokenize(
            &strs(&["私", "は", "Tom2", "で", "す", "。"]),
            TokenizerKind::Char
        ),
        "私はTom2です。"
    );
    assert_eq!(
        detokenize(&strs(&["a", "b"]), TokenizerKind::Whitespace),
        "a b"
    );
    assert_eq!(
        detokenize(&strs(&["iPhone", "X", "很", "好"]), TokenizerKind::Jieba),
        "iPhone X很好"
    );
}

#[test]
fn default_tokenizer_per_language() {
    assert_eq!(default_for_lang("zh"), TokenizerKind::Jieba);
    assert_eq!(default_for_lang("zh-CN"), TokenizerKind::Jieba);
    assert_eq!(default_for_lang("ja"), TokenizerKind::Char);
    assert_eq!(default_for_lang("en"), TokenizerKind::Punct);
    assert_eq!(default_for_lang("FR"), TokenizerKind::Punct);
    assert_eq!(default_for_lang(""), TokenizerKind::Punct);
}

#[test]
fn detokenize_inverts_typical_english() {
    let cases = [
        "I won!",
        "Why me?",
        "I don't know, Tom.",
        "Tom's dog can't swim.",
        "\"Where are you going?\" she asked.",
        "He said, \"I'll be back.\"",
        "It costs $5 (about 4.50 euros).",
        "We're 100% sure... aren't we?",
        "'Hello,' he said.",
        "The boys' room is upstairs.",
        "Mr. Jackson is my teacher.",
        "I live in the U.S. now.",
        "Is it 3:30 p.m. already?",
        "Let's go: you, me and her; OK?",
        "Read and/or write.",
    ];
    let t = tok(TokenizerKind::Punct, false);
    for c in cases {
        let toks = t.tokenize(c);
        assert_eq!(
            detokenize(&toks, TokenizerKind::Punct),
            c,
            "tokens {toks:?}"
        );
    }
}

#[test]
fn detokenize_round_trip_on_tatoeba_test() {
    let lines = read_lines(&tatoeba("test.en")).unwrap();
    let ok = lines
        .iter()
        .filter(|l| detokenize(&punct_tokenize(l), TokenizerKind::Punct) == **l)
        .count();
    let frac = ok as f64 / lines.len() as f64;
    eprintln!(
        "punct detokenize round trip on tatoeba test.en: {ok}/{} = {:.2}%",
        lines.len(),
        100.0 * frac
    );
    assert!(frac >= 0.95, "round trip only {frac}");
}

#[test]
fn tokens_never_contain_whitespace_or_are_empty() {
    let weird = [
        "",
        "   ",
        "\u{3000}",
        "a\u{00a0}b",
        "...",
        "'",
        "n't",
        "'s",
        "x'",
        "''a''",
        "–",
        "U.S.A.",
        "9.",
        "a-",
        "-a",
        "Tom.He",
    ];
    for kind in [
        TokenizerKind::Punct,
        TokenizerKind::Char,
        TokenizerKind::Jieba,
        TokenizerKind::Whitespace,
    ] {
        let t = tok(kind, true);
        for w in weird {
            for x in t.tokenize(w) {
                assert!(
                    !x.is_empty() && !x.contains(char::is_whitespace),
                    "{kind:?} {w:?} -> {x:?}"
                );
            }
        }
    }
}
