use cgnmt_data::{
    merge_subwords, read_lines, word_index_of_subwords, BpeModel, Tokenizer, TokenizerConfig,
    TokenizerKind,
};

use crate::common::{strs, tatoeba};

fn tokenized(file: &str, kind: TokenizerKind, n: usize) -> Vec<Vec<String>> {
    let t = Tokenizer::new(TokenizerConfig {
        kind,
        lowercase: false,
    });
    read_lines(&tatoeba(file))
        .unwrap()
        .iter()
        .take(n)
        .map(|l| t.tokenize(l))
        .collect()
}

#[test]
fn merge_and_index_convention() {
    let sub = strs(&["un@@", "believ@@", "able", "!", "the"]);
    assert_eq!(merge_subwords(&sub), strs(&["unbelievable", "!", "the"]));
    assert_eq!(word_index_of_subwords(&sub), vec![0, 0, 0, 1, 2]);
    // Dangling continuation at the end still forms a word.
    let sub = strs(&["a", "b@@"]);
    assert_eq!(merge_subwords(&sub), strs(&["a", "b"]));
    assert_eq!(word_index_of_subwords(&sub), vec![0, 1]);
    assert!(merge_subwords::<String>(&[]).is_empty());
}

#[test]
fn bpe_train_save_load_apply_round_trip() {
    let en = tokenized("train.en", TokenizerKind::Punct, 3000);
    let model = BpeModel::train(&en, 500).unwrap();
    assert!(
        model.vocab_size() <= 500 && model.vocab_size() > 50,
        "{}",
        model.vocab_size()
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bpe.tgt.json");
    model.save(&p).unwrap();
    let loaded = BpeModel::load(&p).unwrap();
    let test = tokenized("test.en", TokenizerKind::Punct, 2049);
    let mut split = 0usize;
    for words in &test {
        let sub = loaded.apply(words);
        assert_eq!(sub, model.apply(words));
        assert_eq!(&merge_subwords(&sub), words);
        let idx = word_index_of_subwords(&sub);
        assert_eq!(idx.len(), sub.len());
        assert!(idx.iter().all(|&i| i < words.len()));
        split += sub.len() - words.len();
    }
    assert!(split > 0, "a 500-type BPE must split some words");
    // Unseen characters: the word is kept whole, so the round trip is still exact.
    let odd = strs(&["Ωmega", "naïve", "日本"]);
    assert_eq!(merge_subwords(&model.apply(&odd)), odd);
}

#[test]
fn bpe_on_chinese_words() {
    let zh = tokenized("train.zh", TokenizerKind::Jieba, 3000);
    let model = BpeModel::train(&zh, 2000).unwrap();
    for words in tokenized("test.zh", TokenizerKind::Jieba, 300) {
        assert_eq!(merge_subwords(&model.apply(&words)), words);
    }
}

#[test]
fn bpe_load_errors_name_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bpe.src.json");
    std::fs::write(&p, "{not json").unwrap();
    assert!(BpeModel::load(&p)
        .unwrap_err()
        .to_string()
        .contains("bpe.src.json"));
    let missing = dir.path().join("nope.json");
    assert!(BpeModel::load(&missing)
        .unwrap_err()
        .to_string()
        .contains("nope.json"));
    assert!(BpeModel::train(&[], 0).is_err());
}

/// The unigram model (SentencePiece's algorithm): trained, saved and loaded; it splits rare words into
/// pieces and the round trip is exact, unseen characters included; it segments otherwise than BPE of the
/// same size; training twice gives the same model; Chinese words too.
#[test]
fn unigram_train_save_load_apply_round_trip() {
    use cgnmt_data::SubwordKind;
    let en = tokenized("train.en", TokenizerKind::Punct, 3000);
    let model = BpeModel::train_unigram(&en, 800).unwrap();
    assert_eq!(model.kind(), SubwordKind::Unigram);
    assert!(
        model.vocab_size() <= 810 && model.vocab_size() > 100,
        "{}",
        model.vocab_size()
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("unigram.tgt.json");
    model.save(&p).unwrap();
    let loaded = BpeModel::load(&p).unwrap();
    assert_eq!(loaded.kind(), SubwordKind::Unigram);
    let again = BpeModel::train_unigram(&en, 800).unwrap();
    let bpe = BpeModel::train_kind(&en, 800, SubwordKind::Bpe).unwrap();
    assert_eq!(bpe.kind(), SubwordKind::Bpe);
    let test = tokenized("test.en", TokenizerKind::Punct, 2049);
    let (mut split, mut differs) = (0usize, 0usize);
    for words in &test {
        let sub = loaded.apply(words);
        assert_eq!(sub, model.apply(words));
        assert_eq!(sub, again.apply(words), "training is deterministic");
        assert_eq!(&merge_subwords(&sub), words);
        split += sub.len() - words.len();
        differs += usize::from(sub != bpe.apply(words));
    }
    assert!(
        split > 0,
        "an 800-piece unigram model must split some words"
    );
    assert!(differs > 0, "unigram and BPE segment alike everywhere");
    let odd = strs(&["Ωmega", "naïve", "日本"]);
    assert_eq!(merge_subwords(&model.apply(&odd)), odd);
    let zh = tokenized("train.zh", TokenizerKind::Jieba, 3000);
    let model = BpeModel::train_unigram(&zh, 2000).unwrap();
    for words in tokenized("test.zh", TokenizerKind::Jieba, 300) {
        assert_eq!(merge_subwords(&model.apply(&words)), words);
    }
    assert!(BpeModel::train_unigram(&[], 0).is_err());
}

/// BPE-dropout: without dropout it is the model's own segmentation (on every word of 3,000 sentences, and
/// after a save and load); with dropout, more and smaller pieces that still make up the word, from the
/// model's symbols, the same ones again from the same seed.
#[test]
fn bpe_dropout_without_dropout_is_bpe_and_with_it_splits_more() {
    use rand::SeedableRng;
    let en = tokenized("train.en", TokenizerKind::Punct, 3000);
    let model = BpeModel::train(&en, 800).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    model.save(&tmp.path().join("bpe.json")).unwrap();
    let loaded = BpeModel::load(&tmp.path().join("bpe.json")).unwrap();
    let symbols: std::collections::HashSet<String> = loaded.symbols().into_iter().collect();
    assert!(symbols.len() > 2 * 500, "{}", symbols.len());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (mut plain, mut dropped, mut words) = (0usize, 0usize, 0usize);
    for w in en.iter().flatten() {
        let bpe = loaded.apply_word(w);
        assert_eq!(loaded.apply_word_dropout(w, 0.0, &mut rng), bpe, "{w}");
        let d = loaded.apply_word_dropout(w, 0.1, &mut rng);
        assert_eq!(merge_subwords(&d), vec![w.clone()]);
        assert!(d.iter().all(|p| symbols.contains(p)), "{d:?}");
        plain += bpe.len();
        dropped += d.len();
        words += 1;
    }
    assert!(
        dropped as f64 > 1.05 * plain as f64,
        "{dropped} pieces against {plain} ({words} words)"
    );
    let again = |seed| {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        en[..50]
            .iter()
            .flatten()
            .flat_map(|w| loaded.apply_word_dropout(w, 0.3, &mut r))
            .collect::<Vec<_>>()
    };
    assert_eq!(again(7), again(7));
    assert_ne!(again(7), again(8));
}
